"""Recovery you can measure: which objective brings a swapped SmolLM2-135M-Instruct back fastest per CPU-second.

Arms (each a run of the recipe runner, `hf_posenc.train`, from the smoke recipe): SmolLM2-135M-Instruct ->
alibi / nope, objectives lm / distill / lm+distill, LoRA r16 + norms or full fine-tuning; yarn x4
trained on 128-token PoSE windows covering 512 positions against plain 512-token training at the
same tokens per step. Every arm logs its held-out KJV perplexity every `--every` steps (the runner's
`evaluation.every_steps` curve: against steps, tokens and training CPU seconds); at the end the saved
model is scored in same-target mode (the same 64 target tokens at every context length) at the
training length and at 4x it, on held-out KJV and on a text of another kind, Python's own reference
documentation (`pydoc_data.topics`, in every CPython): what each objective keeps of the model's
general ability rather than the Bible's.

    OMP_NUM_THREADS=1 nice python benchmarks/recovery.py                    # every arm
    OMP_NUM_THREADS=1 python benchmarks/recovery.py --arms alibi-lm-lora --steps 25
    OMP_NUM_THREADS=1 python benchmarks/recovery.py --arms alibi-lm-lora --seeds 0,1,2   # its spread over seeds

With `--seeds`, each chosen arm runs once per seed (named `ARM@seedN`: LoRA's initialisation and the data order)
and the table gains each arm's spread over its seeds (n, mean, min..max of the final cells).

Each arm is written as soon as it finishes (benchmarks/results/recovery/recovery.json, .md, .png),
so an interrupted run keeps what it measured; a rerun skips the arms already there. Arms run in other
processes (`--out elsewhere`) join with `--merge elsewhere/recovery.json`. The committed results are
every arm at 200 steps with a curve every 25, run 2-5 processes at a time
on 2 cores; the docs' recovery page (docs/benchmarks/recovery.md) includes them.
"""

from __future__ import annotations

import argparse
import gc
import json
import socket
import math
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

SMOKE = REPO / "recipes/smollm2-135m/alibi/config_smoke.yaml"
TARGET, WINDOWS = 64, 4  # same-target scoring: 64 target tokens x 4 places of each text
LORA = {"use_peft": True, "lora_r": 16, "lora_alpha": 32, "trainable": ["posenc", "norms"]}
FULL = {"use_peft": False}


def _arm(name: str, scheme: str, objective: str, peft: dict[str, Any], *, options: dict[str, Any] | None = None,
         seq_len: int = 128, pose: dict[str, int] | None = None, batch: int = 4, lr: float = 1e-3) -> dict[str, Any]:
    return {"name": name, "scheme": scheme, "options": options or {}, "objective": objective, "peft": peft,
            "seq_len": seq_len, "pose": pose, "batch": batch, "lr": lr}


# In the order they run: the objective question on alibi first, then full FT, nope, and PoSE for length.
ARMS = [
    _arm("alibi-lm-lora", "alibi", "lm", LORA),
    _arm("alibi-distill-lora", "alibi", "distill", LORA),
    _arm("alibi-lm+distill-lora", "alibi", "lm+distill", LORA),
    _arm("alibi-lm-full", "alibi", "lm", FULL, lr=1e-4),
    _arm("nope-lm-lora", "nope", "lm", LORA),
    _arm("nope-distill-lora", "nope", "distill", LORA),
    # same tokens per step (4 x 128 = 1 x 512): 128-token windows with PoSE ids over 512, or 512-token rows
    _arm("yarn4-pose128-lora", "yarn", "lm", LORA, options={"factor": 4.0}, pose={"target_length": 512, "chunks": 2}),
    _arm("yarn4-plain512-lora", "yarn", "lm", LORA, options={"factor": 4.0}, seq_len=512, batch=1),
]


def texts(tokenizer: Any) -> dict[str, Any]:
    """Held-out KJV (the tail the recipe holds out: data.eval_fraction 0.02) and Python's reference docs."""
    import torch
    from pydoc_data.topics import topics

    from hf_posenc.data import long_text

    kjv = tokenizer(long_text("kjv"), add_special_tokens=False, return_tensors="pt")["input_ids"][0]
    docs = "\n\n".join(topics[k] for k in sorted(topics))
    return {"kjv held-out": kjv[int(kjv.numel() * 0.98):],
            "python docs": torch.tensor(tokenizer(docs, add_special_tokens=False)["input_ids"][:60_000])}


def score(model: Any, streams: dict[str, Any], lengths: list[int]) -> dict[str, dict[str, float]]:
    """Same-target perplexity of `model` on each text at each length."""
    from hf_posenc.evaluation import perplexity_by_length

    return {name: {str(n): cell["perplexity"] for n, cell in perplexity_by_length(
        model, ids, lengths, mode="same_target", target=TARGET, max_windows=WINDOWS).items()}
        for name, ids in streams.items()}


def recipe(arm: dict[str, Any], steps: int, every: int, out: Path) -> Any:
    from hf_posenc.train.reading import from_dict

    data = {**yaml.safe_load(SMOKE.read_text()), "scheme": arm["scheme"], "scheme_options": arm["options"], **arm["peft"],
            "seq_len": arm["seq_len"], "pose": arm["pose"], "max_eval_samples": 8 * 128 // arm["seq_len"],
            "max_steps": steps, "global_batch_size": arm["batch"], "per_device_train_batch_size": min(2, arm["batch"]),
            "learning_rate": arm["lr"], "warmup_steps": 5, "save_strategy": "no", "objective": arm["objective"],
            "seed": arm.get("seed", 42), "eval_original": False, "eval_before": True, "eval_after": False,
            "eval_every_steps": every, "perplexity_lengths": [], "per_device_eval_batch_size": 4, "output_dir": str(out),
            "merge_lora": True, "save_model": True, "plot": True}
    data.pop("save_steps", None)
    return from_dict(data, source=f"benchmarks/recovery.py:{arm['name']}")


def run_arm(arm: dict[str, Any], args: argparse.Namespace, streams: dict[str, Any]) -> dict[str, Any]:
    import hf_posenc as hp
    from hf_posenc.train import train

    folder = Path(args.work) / arm["name"]
    shutil.rmtree(folder, ignore_errors=True)
    t0, c0 = time.perf_counter(), time.process_time()
    record = train(recipe(arm, args.steps, args.every, folder))
    model = hp.from_pretrained(str(folder)).eval()
    final = score(model, streams, [128, 512])  # every arm at the same two lengths: 128 and 4x it
    del model
    gc.collect()
    shutil.copy(folder / "curve.png", Path(args.out) / f"curve_{arm['name']}.png")
    shutil.rmtree(folder)  # ~0.5 GB of weights per arm; the numbers are kept
    return {**arm, "steps": record.details["steps"], "curve": record.details["curve"], "final": final,
            "train_wall_s": record.details["train_seconds"], "arm_wall_s": time.perf_counter() - t0,
            "arm_cpu_s": time.process_time() - c0}


def _label(scheme: str, options: dict[str, Any]) -> str:
    return " ".join([scheme, *(f"{k}={v}" for k, v in options.items())]) + ", no training"


def baselines(found: dict[str, Any], streams: dict[str, Any], schemes: list[tuple[str, dict[str, Any]]]) -> None:
    """The original model and each swap before any training, scored as the arms are (only those not yet in
    `found`, so arms added later bring their own swap's row)."""
    import torch

    import hf_posenc as hp
    from hf_posenc.loading import load

    rows = found.setdefault("baselines", {})
    missing = [(scheme, options) for scheme, options in schemes if _label(scheme, options) not in rows]
    if "original (rope)" in rows and not missing:
        return
    model, _ = load("smollm2", dtype=torch.float32)
    rows.setdefault("original (rope)", score(model, streams, [128, 512]))
    for scheme, options in missing:
        hp.patch(model, scheme, **options)
        rows[_label(scheme, options)] = score(model, streams, [128, 512])
        hp.unpatch(model)


def markdown(found: dict[str, Any]) -> str:
    streams = list(found["baselines"]["original (rope)"])
    head = ["arm (same-target perplexity, 256 tokens a cell)", "steps", "train CPU s", *(f"{s} ppl @ {n}" for s in streams for n in ("128", "512"))]
    rows = [f"| {label} | 0 | 0 | " + " | ".join(f"{ppl[s][n]:.1f}" for s in streams for n in ("128", "512")) + " |"
            for label, ppl in found["baselines"].items()]
    for arm in found["arms"].values():
        cpu = arm["curve"][-1]["cpu_s"]
        rows.append(f"| {arm['name']} | {arm['steps']} | {cpu:.0f} | " + " | ".join(
            f"{arm['final'][s].get(n, math.nan):.1f}" for s in streams for n in ("128", "512")) + " |")
    return ("\n".join(["| " + " | ".join(head) + " |", "|---" * len(head) + "|", *rows]) + "\n\n" + per_cpu(found)
            + seeds_spread(found))


def seeds_spread(found: dict[str, Any]) -> str:
    """Per arm run at several seeds (`ARM@seedN`): n, mean and min..max of each final cell."""
    import statistics

    groups: dict[str, list[dict[str, Any]]] = {}
    for name, arm in found["arms"].items():
        if "@seed" in name:
            groups.setdefault(name.split("@seed")[0], []).append(arm["final"])
    lines = []
    for base, finals in groups.items():
        for text in finals[0]:
            for n in ("128", "512"):
                values = [f[text][n] for f in finals if n in f[text]]
                lines.append(f"| {base} | {text} @ {n} | {len(values)} | {statistics.mean(values):.2f} | "
                             f"{min(values):.2f}..{max(values):.2f} |")
    if not lines:
        return ""
    return "\n".join(["\n| arm over seeds | cell | n | mean | min..max |", "|---|---|---|---|---|", *lines]) + "\n"


BUDGETS = (250, 500, 900)  # training CPU seconds


def per_cpu(found: dict[str, Any]) -> str:
    """Which arm recovers fastest per CPU-second: each curve's held-out perplexity at its training length, at
    the last point within each budget (no interpolation: a point past the budget is not counted)."""
    head = ["arm (curve: held-out KJV blocks at the training length)", *(f"≤ {b} CPU s" for b in BUDGETS)]
    rows = []
    for arm in found["arms"].values():
        cells = []
        for budget in BUDGETS:
            within = [r for r in arm["curve"] if r["cpu_s"] <= budget and r["step"] > 0]
            cells.append(f"{within[-1]['perplexity'][str(arm['seq_len'])]:.1f} (step {within[-1]['step']})"
                         if within else "—")
        rows.append(f"| {arm['name']} | " + " | ".join(cells) + " |")
    return "\n".join(["| " + " | ".join(head) + " |", "|---" * len(head) + "|", *rows]) + "\n"


def plot(found: dict[str, Any], path: Path) -> None:
    """Left: held-out KJV perplexity at the training length (the runner's curve) against training CPU seconds.
    Right: the final same-target perplexity on each text, with the original model and the untrained swaps."""
    import numpy as np

    from hf_posenc import plots

    plt = plots.pyplot()
    fig, (curves, bars) = plt.subplots(1, 2, figsize=(12, 4))
    for arm in found["arms"].values():
        key = str(arm["seq_len"])
        curves.plot([r["cpu_s"] for r in arm["curve"]], [r["perplexity"][key] for r in arm["curve"]], marker="o",
                    ms=3, label=f"{arm['name']} ({arm['steps']} steps)")
    curves.set(title="Recovery curve: SmolLM2-135M-Instruct after the swap", xlabel="training CPU seconds",
               ylabel="held-out KJV perplexity (training-length blocks)", yscale="log")
    rows = {**found["baselines"], **{name: arm["final"] for name, arm in found["arms"].items()}}
    streams, width = list(found["baselines"]["original (rope)"]), 0.8 / len(rows)
    for i, (label, final) in enumerate(rows.items()):
        bars.bar(np.arange(len(streams)) + i * width, [final[s]["128"] for s in streams], width, label=label,
                 color=plt.cm.tab20(i % 20))  # 12+ rows: the default 10-colour cycle would repeat
    bars.set_xticks(np.arange(len(streams)) + 0.4 - width / 2, [f"{s} @ 128" for s in streams])
    bars.set(title="After training: same-target perplexity\n(64 tokens x 4 places)", yscale="log", ylabel="perplexity")
    plots.legend_outside(fig, fontsize=7)
    plots.save(fig, path)


def write(found: dict[str, Any], out: Path) -> None:
    from hf_posenc import results

    results.write_json(out / "recovery.json", found)
    if found["arms"]:
        (out / "recovery.md").write_text(markdown(found))
        plot(found, out / "recovery.png")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps per arm")
    parser.add_argument("--every", type=int, default=25, help="curve: held-out perplexity every N steps")
    parser.add_argument("--arms", default=",".join(a["name"] for a in ARMS), help="comma-separated arm names")
    parser.add_argument("--out", default=str(HERE / "results" / "recovery"))
    parser.add_argument("--work", default="/tmp/hf-posenc-recovery", help="scratch folder for the arms' models")
    parser.add_argument("--seeds", default="", help="comma-separated seeds: each chosen arm once per seed")
    parser.add_argument("--merge", nargs="*", default=[], help="recovery.json files of runs in other processes: "
                        "add their arms to --out's (arms run in parallel on a machine with free cores)")
    args = parser.parse_args()
    import torch
    from transformers import AutoTokenizer

    from hf_posenc.models import model_source

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "recovery.json"
    found = json.loads(path.read_text()) if path.is_file() else {"baselines": {}, "arms": {}}
    found["settings"] = {"every": args.every, "target_tokens": TARGET, "windows": WINDOWS,
                         "threads": torch.get_num_threads(), "host": socket.gethostname()}

    source, kwargs = model_source("smollm2")
    streams = texts(AutoTokenizer.from_pretrained(source, **kwargs))
    for other in args.merge:
        joined = json.loads(Path(other).read_text())
        found["arms"].update(joined["arms"])
        found["baselines"] = {**joined["baselines"], **found["baselines"]}
    chosen = [a for a in ARMS if a["name"] in args.arms.split(",")]
    if args.seeds:
        chosen = [{**a, "name": f"{a['name']}@seed{seed}", "seed": int(seed)} for a in chosen
                  for seed in args.seeds.split(",")]
    baselines(found, streams, [(a["scheme"], a["options"]) for a in chosen])
    write(found, out)
    for arm in chosen:
        if arm["name"] in found["arms"]:
            continue
        print(f"== {arm['name']}", flush=True)
        found["arms"][arm["name"]] = run_arm(arm, args, streams)
        write(found, out)
    write(found, out)
    print(markdown(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
