"""Training throughput: the recipe runner (hf_posenc.train) vs a plain transformers Trainer loop.

Same model, same patch, same LoRA/trainable set, same packed data, same batch and accumulation,
same optimizer (fused AdamW, the Trainer's default) and schedule. Each measurement runs in its own
process (peak RSS is per process); throughput counts the steps after the first (warm-up), per
second of wall time and per second of process CPU time. On a shared machine the wall clock
measures the neighbours as much as the loop, so the ratio is taken per adjacent pair of runs
(runner and Trainer back to back, order alternating) and on CPU time; run it with
OMP_NUM_THREADS=1 for the same reason.

    python benchmarks/train_throughput.py                        # SmolLM2-135M-Instruct + alibi, seq 256
    python benchmarks/train_throughput.py --model tiny --steps 30 # a random 4-layer llama, quick

Writes benchmarks/results/train_throughput.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _recipe(args: argparse.Namespace, out: Path) -> dict:
    model = args.model
    if model == "tiny":  # a random llama big enough that the loop overhead is measurable
        import transformers

        model = str(out.parent / "tiny-model")
        if not Path(model).exists():
            import torch

            torch.manual_seed(0)
            config = transformers.LlamaConfig(hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                                              num_attention_heads=8, num_key_value_heads=4, vocab_size=49152,
                                              max_position_embeddings=2048)
            transformers.AutoModelForCausalLM.from_config(config).save_pretrained(model)
            from hf_posenc.loading import load_tokenizer

            load_tokenizer("smollm2").save_pretrained(model)
    return {
        "model_name_or_path": model, "scheme": args.scheme, "use_peft": True, "lora_r": 16, "lora_alpha": 32,
        "trainable": ["posenc", "norms"], "dataset_name": "kjv", "seq_len": args.seq_len,
        "max_train_samples": args.batch * args.steps, "max_eval_samples": 1, "max_steps": args.steps,
        "global_batch_size": args.batch, "per_device_train_batch_size": args.micro_batch, "learning_rate": 1e-4,
        "warmup_steps": 0, "lr_scheduler_type": "linear", "seed": 0, "save_strategy": "no", "eval_original": False,
        "eval_before": False, "eval_after": False, "output_dir": str(out), "save_model": False, "plot": False,
    }


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _throughput(times: list[float], tokens_per_step: int) -> float:
    """Tokens/s over steps 2..N (step 1 pays one-off costs in both loops)."""
    return tokens_per_step * (len(times) - 1) / (times[-1] - times[0])


def worker_runner(args: argparse.Namespace, recipe: dict) -> dict:
    from hf_posenc.train.reading import from_dict
    from hf_posenc.train.runner import train

    train(from_dict(recipe))
    log = json.loads((Path(recipe["output_dir"]) / "loss.json").read_text())
    tokens = args.batch * args.seq_len
    return {"tokens_per_s": _throughput([r["elapsed_s"] for r in log], tokens),
            "tokens_per_cpu_s": _throughput([r["cpu_s"] for r in log], tokens),
            "final_loss": log[-1]["loss"], "peak_rss_mb": _peak_mb()}


def worker_trainer(args: argparse.Namespace, recipe_data: dict) -> dict:
    import transformers

    from hf_posenc.train import inputs, modeling, tasks
    from hf_posenc.train.reading import from_dict

    recipe = from_dict(recipe_data)
    transformers.set_seed(0)
    raw = inputs.load_raw(recipe)
    model, tokenizer = modeling.load_recipe_model(recipe)
    model = modeling.select_trainable(model, recipe, modeling.apply_posenc(model, recipe))
    data = tasks.prepare(recipe, raw, tokenizer)
    times: list[float] = []
    cpu: list[float] = []

    class Clock(transformers.TrainerCallback):
        def on_step_end(self, *_, **__):
            times.append(time.perf_counter())
            cpu.append(time.process_time())

    t = recipe.training
    targs = transformers.TrainingArguments(
        output_dir=t.output_dir, max_steps=t.max_steps, per_device_train_batch_size=t.per_device_train_batch_size,
        gradient_accumulation_steps=recipe.accumulation(1), learning_rate=t.learning_rate,
        lr_scheduler_type="linear", warmup_steps=0, max_grad_norm=t.max_grad_norm, weight_decay=0.0,
        logging_steps=1, save_strategy="no", eval_strategy="no", report_to="none", use_cpu=True,
        disable_tqdm=True, dataloader_num_workers=0, seed=0,
    )
    trainer = transformers.Trainer(model=model, args=targs, train_dataset=data.train, data_collator=data.collate,
                                   callbacks=[Clock()])
    trainer.train()
    losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    tokens = args.batch * args.seq_len
    return {"tokens_per_s": _throughput(times, tokens), "tokens_per_cpu_s": _throughput(cpu, tokens),
            "final_loss": losses[-1], "peak_rss_mb": _peak_mb()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2", help="'smollm2', 'tiny', or a model folder")
    parser.add_argument("--scheme", default="alibi")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8, help="global sequences per step")
    parser.add_argument("--micro-batch", type=int, default=2)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=2, help="runs per loop, alternating; the median is kept")
    parser.add_argument("--out", default=str(HERE / "results" / "train_throughput.json"))
    parser.add_argument("--worker", choices=["runner", "trainer"], help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        recipe = _recipe(args, Path(args.workdir) / args.worker)
        result = (worker_runner if args.worker == "runner" else worker_trainer)(args, recipe)
        print("RESULT " + json.dumps(result))
        return

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    runs: dict[str, list[dict]] = {"runner": [], "trainer": []}
    with tempfile.TemporaryDirectory() as work:
        for i in range(args.repeats):
            for loop in (("runner", "trainer") if i % 2 == 0 else ("trainer", "runner")):
                cmd = [sys.executable, __file__, "--worker", loop, "--workdir", work, "--model", args.model,
                       "--scheme", args.scheme, "--seq-len", str(args.seq_len), "--batch", str(args.batch),
                       "--micro-batch", str(args.micro_batch), "--steps", str(args.steps)]
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
                lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
                if proc.returncode or not lines:
                    sys.exit(f"{loop} failed:\n{proc.stderr[-4000:]}")
                runs[loop].append(json.loads(lines[-1][7:]))
                print(loop, runs[loop][-1], flush=True)
                for sub in ("runner", "trainer"):
                    subprocess.run(["rm", "-rf", str(Path(work) / sub)], check=True)

    summary = {loop: {key: statistics.median(r[key] for r in rs) for key in ("tokens_per_s", "tokens_per_cpu_s")}
               | {"peak_rss_mb": max(r["peak_rss_mb"] for r in rs), "final_loss": rs[0]["final_loss"], "runs": rs}
               for loop, rs in runs.items()}
    pairs = list(zip(runs["runner"], runs["trainer"]))
    result = {
        "model": args.model, "scheme": args.scheme, "seq_len": args.seq_len, "batch": args.batch,
        "micro_batch": args.micro_batch, "steps": args.steps, "cpus": os.cpu_count(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), **summary,
        "ratio_wall_per_pair": [r["tokens_per_s"] / t["tokens_per_s"] for r, t in pairs],
        "ratio_runner_over_trainer_wall": statistics.median(r["tokens_per_s"] / t["tokens_per_s"] for r, t in pairs),
        "ratio_runner_over_trainer_cpu": statistics.median(
            r["tokens_per_cpu_s"] / t["tokens_per_cpu_s"] for r, t in pairs),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k not in ("runner", "trainer")}, indent=1))
    print(f"runner {summary['runner']['tokens_per_s']:.0f} tok/s, Trainer {summary['trainer']['tokens_per_s']:.0f} tok/s "
          f"(wall); {summary['runner']['tokens_per_cpu_s']:.0f} vs {summary['trainer']['tokens_per_cpu_s']:.0f} tok/cpu-s")


if __name__ == "__main__":
    main()
