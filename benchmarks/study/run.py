"""Added, concatenated, rotated, biased or none: small GPT-2-shaped decoders trained from scratch on
the KJV with one positional scheme each (`arms.py`), everything else equal (`settings.py`).

    python benchmarks/study/run.py                 # the full study (~2 h on 2 CPU cores)
    python benchmarks/study/run.py --smoke         # 2 arms x 1 seed x 4 steps: checks the pipeline
    python benchmarks/study/run.py --arms learned,rope --seeds 0    # some arms, appended to OUT/results.json
    python benchmarks/study/run.py --scale gpu --budget 220  # the second scale (scale.py): OUT/results_gpu.json

Each run trains through the project's recipe runner (`hf_posenc.train`, full fine-tuning of a random
init), then `measure.py` scores it. OUT/results.json = {"runs": [{"arm", "seed", "tokens", "params",
"metrics"}], "settings"} grows after every run, and a rerun skips the runs it already holds (same
settings); OUT/results.md and OUT/*.png summarise it (mean +- std over seeds, paired vs `learned`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
import transformers  # noqa: E402
from arms import Arm, arms  # noqa: E402
from measure import checkpoint_model, encoding, geometry, held_out_ids, length_metrics  # noqa: E402
from scale import SMOKE_SCALE, TRAIN_SHARE, Scale, autocast, scale, sized, tokens_per_second, training_on  # noqa: E402
from scale import device as pick_device  # noqa: E402
from settings import FULL, SMOKE, Settings  # noqa: E402,F401 (SMOKE: the smoke budget, read by tests/test_study.py)
from tokenizer import train_bpe  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

import hf_posenc as hp  # noqa: E402
from hf_posenc import data, plots  # noqa: E402
from hf_posenc.results import write_json  # noqa: E402
from hf_posenc.train import run_folder, runner  # noqa: E402
from hf_posenc.train.reading import from_dict  # noqa: E402

EVAL_BATCH = {"cpu": 1, "cuda": 16}  # perplexity windows scored at once (1 on the CPU, as the CPU scale was)


def init_model(arm: Arm, s: Settings, tokenizer: Any, seed: int, folder: Path) -> Path:
    """A random GPT-2 of the study's shape, saved with the tokenizer; the recipe patches its positions (a
    layer map arm is patched here).
    Its learned table covers the training length only: that arm cannot run longer inputs (a skipped cell)."""
    torch.manual_seed(seed)
    width = s.width + arm.extra_width
    config = transformers.GPT2Config(vocab_size=len(tokenizer), n_positions=s.seq_len, n_embd=width, n_layer=s.layers,
                                     n_head=s.heads, bos_token_id=tokenizer.eos_token_id,
                                     eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id)
    model = transformers.GPT2LMHeadModel(config)
    if arm.layered:  # saved patched, the runner's load restores the map; rope and nope draw no random numbers
        hp.patch(model, arm.scheme)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def recipe_for(arm: Arm, s: Settings, init: Path, seed: int, out: Path, precision: str = "no") -> Any:
    """The run's recipe: full training of `init`, checkpoints only where the geometry is traced, in `precision`
    (bf16 autocast on CUDA). A layer map is already in `init`: the recipe's `scheme` is one name
    (hf_posenc/train/recipe.py, PosEncArguments)."""
    save_steps = s.steps // s.checkpoints if arm.added and s.checkpoints > 1 else 0
    return from_dict({
        "model_name_or_path": str(init),
        **({"scheme": None} if arm.layered else {"scheme": arm.scheme, "scheme_options": dict(arm.options)}),
        "use_peft": False, "dataset_name": "kjv", "seq_len": s.seq_len, "eval_fraction": s.eval_fraction,
        "max_eval_samples": 8, "max_steps": s.steps, "global_batch_size": s.batch_size,
        "per_device_train_batch_size": s.batch_size, "learning_rate": s.lr, "lr_scheduler_type": "cosine",
        "warmup_steps": max(1, s.steps // 20), "weight_decay": 0.1, "seed": seed,
        **({"save_steps": save_steps} if save_steps else {"save_strategy": "no"}), "save_total_limit": None,
        **({"bf16": True} if precision == "bf16" else {}), "per_device_eval_batch_size": 4,
        "eval_original": False, "eval_before": False, "eval_after": True, "output_dir": str(out), "plot": False,
    }, source=f"study arm {arm}")


def one_run(name: str, arm: Arm, seed: int, s: Settings, tokenizer: Any, ids: torch.Tensor, work: Path,
            where: torch.device = torch.device("cpu")) -> dict[str, Any]:
    """Train one (arm, seed), score it on `where` (bf16 autocast and batched windows on CUDA), and trace the
    geometry of an added arm through its checkpoints (on the CPU)."""
    folder = work / f"{name}-seed{seed}"
    shutil.rmtree(folder, ignore_errors=True)
    precision = "bf16" if where.type == "cuda" else "no"
    recipe = recipe_for(arm, s, init_model(arm, s, tokenizer, seed, folder / "init"), seed, folder / "run", precision)
    t0 = time.perf_counter()
    trained = runner.train(recipe, overwrite=True)
    seconds = time.perf_counter() - t0
    model = hp.from_pretrained(folder / "run").to(where)
    with autocast(where):
        scored = length_metrics(model, tokenizer, ids, s, batch_size=EVAL_BATCH[where.type])
    model = model.cpu()
    metrics = {**scored, "held_out_loss": trained.run("after training").metrics["perplexity"][str(s.seq_len)]["loss"]}
    if where.type != "cpu":
        metrics["train_seconds"] = round(seconds, 1)
    if arm.added:
        # Trainer also keeps a checkpoint at the last step: that point is the trained model, measured below
        saved = ((int(c.name.split("-")[1]), c) for c in run_folder.checkpoints(folder / "run"))
        steps = [(0, None), *((step, c) for step, c in saved if step < s.steps)]
        trace = [{"step": step, **geometry(checkpoint_model(recipe, ckpt), ids, s.seq_len)} for step, ckpt in steps]
        metrics["geometry"] = [*trace, {"step": s.steps, **geometry(model, ids, s.seq_len)}]
    return {"arm": name, "seed": seed, "tokens": sum(trained.details["tokens_per_rank"]),
            "params": sum(p.numel() for p in model.parameters()), "metrics": metrics}


def add_encoding(runs: list[dict[str, Any]], table: dict[str, Arm], s: Settings, work: Path) -> None:
    """Shift-fit R^2 and token-direction shares of every added arm's trained code that lacks them
    (read from the run folder the training left, so a finished study gains them without retraining)."""
    for run in runs:
        folder = work / f"{run['arm']}-seed{run['seed']}" / "run"
        if table[run["arm"]].added and "encoding" not in run["metrics"] and folder.is_dir():
            run["metrics"]["encoding"] = encoding(hp.from_pretrained(folder), s.seq_len)


def summary(runs: list[dict[str, Any]], s: Settings) -> str:
    """Mean +- std over seeds per arm, and the mean paired difference against `learned` (same seed)."""
    lengths = [s.seq_len, 2 * s.seq_len, 4 * s.seq_len]

    def value(run: dict[str, Any], metric: str, L: int) -> float | None:
        cell = run["metrics"][metric].get(str(L), {})
        return cell.get("perplexity", cell.get("accuracy"))

    def stat(values: list[float | None]) -> str:
        got = [v for v in values if v is not None and math.isfinite(v)]
        if not got:
            return "skipped"
        return f"{statistics.mean(got):.3g} ± {statistics.stdev(got):.2g}" if len(got) > 1 else f"{got[0]:.3g}"

    learned = {r["seed"]: r for r in runs if r["arm"] == "learned"}
    head = (["arm", "seeds", "params"] + [f"ppl @ {L}" for L in lengths] + [f"passkey @ {L}" for L in lengths]
            + [f"Δ ppl @ {s.seq_len} vs learned"])
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for arm in dict.fromkeys(r["arm"] for r in runs):
        mine = [r for r in runs if r["arm"] == arm]
        paired = [value(r, "perplexity", s.seq_len) - value(learned[r["seed"]], "perplexity", s.seq_len)
                  for r in mine if r["seed"] in learned and value(r, "perplexity", s.seq_len) is not None]
        cells = ([arm, str(len(mine)), f"{mine[0]['params'] / 1e6:.2f}M"]
                 + [stat([value(r, "perplexity", L) for r in mine]) for L in lengths]
                 + [stat([value(r, "passkey", L) for r in mine]) for L in lengths] + [stat(paired)])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + f"\n\n{mine[0]['tokens']:,} training tokens per run; same-target perplexity " \
        f"({s.windows} windows x {s.target} tokens) on the held-out KJV tail.\n"


def geometry_summary(runs: list[dict[str, Any]]) -> str:
    """The added arms' trained position code, mean +- std over seeds: energy share in the token subspace and
    median principal angle (each vs random subspaces), layer-0 four-term shares, shift-fit R^2 at the
    smallest and a middle offset, and position variation along the token embedding's top / bottom quarter."""

    def stat(values: list[float]) -> str:
        return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}" if len(values) > 1 else f"{values[0]:.2f}"

    added = [r for r in runs if "geometry" in r["metrics"]]
    if not added:
        return ""
    head = ["arm", "energy in token subspace (random)", "median angle ° (random)", "c·c", "c·p + p·c", "p·p",
            "R² k=1 (random)", "R² mid k (random)", "variation top / bottom ¼"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for arm in dict.fromkeys(r["arm"] for r in added):
        mine = [r for r in added if r["arm"] == arm]
        end = [r["metrics"]["geometry"][-1] for r in mine]
        terms = [g["four_terms"] for g in end]
        cells = [arm, f"{stat([g['position_energy_in_token_subspace'] for g in end])} "
                      f"({statistics.mean(g['random_energy'] for g in end):.2f})",
                 f"{stat([g['angles_median_deg'] for g in end])} "
                 f"({statistics.mean(g['random_angles_median_deg'] for g in end):.1f})",
                 stat([t["content-content"] for t in terms]),
                 stat([t["content-position"] + t["position-content"] for t in terms]),
                 stat([t["position-position"] for t in terms])]
        enc = [r["metrics"]["encoding"] for r in mine if "encoding" in r["metrics"]]
        if enc:
            mid = len(enc[0]["offsets"]) // 2
            cells += [f"{stat([e['r2'][0] for e in enc])} ({statistics.mean(e['random_r2'][0] for e in enc):.2f})",
                      f"{stat([e['r2'][mid] for e in enc])} @ k={enc[0]['offsets'][mid]} "
                      f"({statistics.mean(e['random_r2'][mid] for e in enc):.2f})",
                      f"{stat([e['variation_top_token_quarter'] for e in enc])} / "
                      f"{stat([e['variation_bottom_token_quarter'] for e in enc])}"]
        else:
            cells += ["–"] * 3
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def draw_geometry(runs: list[dict[str, Any]], out: Path, name: str = "geometry.png") -> None:
    """Layer-0 four-term shares over training, and shift-fit R^2 against the offset, for the added arms."""
    added = [r for r in runs if "geometry" in r["metrics"]]
    if not added:
        return
    plt = plots.pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.2))
    for i, arm in enumerate(dict.fromkeys(r["arm"] for r in added)):
        mine = [r for r in added if r["arm"] == arm]
        steps = [g["step"] for g in mine[0]["metrics"]["geometry"]]

        def mean(term: str) -> list[float]:
            return [statistics.mean(r["metrics"]["geometry"][j]["four_terms"][term] for r in mine)
                    for j in range(len(steps))]

        color = f"C{i}"
        ax.plot(steps, mean("content-content"), "o-", color=color, label=f"{arm} c·c")
        ax.plot(steps, mean("position-position"), "s--", color=color, label=f"{arm} p·p")
        enc = [r["metrics"]["encoding"] for r in mine if "encoding" in r["metrics"]]
        if enc:
            k = enc[0]["offsets"]
            bx.plot(k, [statistics.mean(e["r2"][j] for e in enc) for j in range(len(k))], "o-", color=color, label=arm)
            bx.plot(k, [statistics.mean(e["random_r2"][j] for e in enc) for j in range(len(k))], ":", color=color)
    ax.set(xlabel="training step", ylabel="share of layer-0 logit variation",
           title="four terms of layer-0 attention (c·p and p·c: the rest)")
    bx.set(xscale="log", xlabel="offset k", ylabel="R²", ylim=(-0.05, 1.05),
           title="PE(p+k) ≈ M_k PE(p): fit by least squares\n(dotted: random table)")
    plots.legend_outside(fig, fontsize=7)
    plots.save(fig, out / name)


def draw(runs: list[dict[str, Any]], out: Path, name: str = "study.png") -> None:
    """Mean same-target perplexity by length per arm; energy share over training for the added arms."""
    plt = plots.pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.2))
    for arm in dict.fromkeys(r["arm"] for r in runs):
        mine = [r for r in runs if r["arm"] == arm]
        table = [{int(L): c["perplexity"] for L, c in r["metrics"]["perplexity"].items() if "perplexity" in c} for r in mine]
        lengths = sorted(set.intersection(*(set(t) for t in table)))
        if lengths:
            ax.plot(lengths, [statistics.mean(t[L] for t in table) for L in lengths], "o-", label=arm)
        if "geometry" in mine[0]["metrics"]:
            trace = mine[0]["metrics"]["geometry"]
            bx.plot([g["step"] for g in trace], [g["position_energy_in_token_subspace"] for g in trace], "o-", label=arm)
            bx.plot([g["step"] for g in trace], [g["random_energy"] for g in trace], ":", color="0.6")
    ax.set(xscale="log", yscale="log", xlabel="context length (tokens)", ylabel="perplexity (same targets)",
           title="held-out perplexity by length")
    bx.set(xlabel="training step", ylabel="share", title="position energy in the token subspace (dotted: random)")
    plots.legend_outside(fig, fontsize=7)
    plots.save(fig, out / name)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", choices=("cpu", "gpu"), default="cpu",
                        help="cpu: the first study (results.json); gpu: the second scale (scale.py, results_gpu.json)")
    parser.add_argument("--smoke", action="store_true", help=f"tiny budget, arms {', '.join(SMOKE_SCALE.arms)}, 1 seed")
    parser.add_argument("--tiny", action="store_true", help="--scale gpu at the smoke size: its pipeline on a CPU")
    parser.add_argument("--arms", default=None, help="comma-separated subset of the arms")
    parser.add_argument("--seeds", default=None, help="comma-separated seeds (default: the settings')")
    parser.add_argument("--device", default=None, choices=("auto", "cpu", "cuda"),
                        help="where runs train and score (default: cpu for --scale cpu, auto for gpu)")
    parser.add_argument("--budget", type=float, default=0.0,
                        help="seconds: sizes the gpu scale's steps, and no run starts that would end past it (0: none)")
    parser.add_argument("--out", default=str(HERE), help="results (STEM.json, STEM.md, plots) and scratch (work/, tokenizer)")
    return parser.parse_args(argv)


def plan(args: argparse.Namespace, sc: Scale, runs: int, done: dict[str, Any], where: torch.device
         ) -> tuple[Settings, dict[str, Any] | None]:
    """The settings to run: the preset's; for a sized scale, those its results file holds (a rerun continues
    them), else steps sized from the training throughput measured here (scale.sized)."""
    s = sc.settings
    seeds = tuple(int(x) for x in args.seeds.split(",")) if args.seeds else s.seeds
    if not sc.sized:
        return dataclasses.replace(s, seeds=seeds), None
    if "sizing" in done:
        kept = {f.name: done["settings"][f.name] for f in dataclasses.fields(Settings) if f.name != "seeds"}
        return Settings(**kept, seeds=seeds), done["sizing"]
    rate = tokens_per_second(s, where)
    s = dataclasses.replace(sized(s, rate, args.budget, runs * len(seeds), sc), seeds=seeds)
    sizing = {"device": torch.cuda.get_device_name() if where.type == "cuda" else "cpu", "torch": torch.__version__,
              "transformers": transformers.__version__, "tokens_per_s": round(rate), "budget_s": args.budget,
              "runs": runs * len(seeds), "tokens_per_run": s.tokens, "times_cpu_scale": round(s.tokens / FULL.tokens, 1),
              "estimated_train_s_per_run": round(s.tokens / rate, 1)}
    print(f"{sc.name} scale: {rate:,.0f} training tokens/s on {sizing['device']}: {s.steps} steps x {s.batch_size} x "
          f"{s.seq_len} = {s.tokens:,} tokens per run ({sizing['times_cpu_scale']}x the CPU scale), "
          f"~{sizing['estimated_train_s_per_run']} s of training each", flush=True)
    return s, sizing


def report(runs: list[dict[str, Any]], s: Settings, sc: Scale, out: Path, plots_too: bool) -> None:
    """STEM.md from the runs so far (after every run: a study cut short keeps its table), and the plots."""
    if not runs:
        (out / f"{sc.stem}.md").write_text(f"No run yet: {s.tokens:,} training tokens a run ({s.steps} steps).\n")
        return
    (out / f"{sc.stem}.md").write_text(summary(runs, s) + "\n" + geometry_summary(runs))
    if plots_too:
        draw(runs, out, sc.plots[0])
        draw_geometry(runs, out, sc.plots[1])


def main(argv: list[str] | None = None) -> int:
    start = time.monotonic()
    args = parse(argv)
    sc = scale(args.scale, smoke=args.smoke, tiny=args.tiny)
    where = pick_device(args.device, sc)
    table = arms(sc.settings.width, sc.settings.layers)
    names = args.arms.split(",") if args.arms else list(sc.arms or table)
    unknown = [n for n in names if n not in table]
    if unknown:
        raise hp.PosEncError(f"unknown arm(s) {', '.join(unknown)}; the arms are {', '.join(table)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{sc.stem}.json"
    done = json.loads(path.read_text()) if path.is_file() else {}
    s, sizing = plan(args, sc, len(names), done, where)
    budget = {**dataclasses.asdict(s), "seeds": None, "tokens_per_run": s.tokens}  # what makes runs comparable
    settings = {**budget, "seeds": list(s.seeds), "arms": {n: dataclasses.asdict(table[n]) for n in table}}
    saved = {"settings": settings, **({"sizing": sizing} if sizing else {})}
    # a rerun keeps the runs of the same budget (an interrupted study continues) and redoes the others
    same = {**done.get("settings", {}), "seeds": None, "arms": None} == {**budget, "arms": None}
    runs = done.get("runs", []) if same else []
    text = data.long_text("kjv")
    tokenizer = train_bpe(text[: int(len(text) * (1 - s.eval_fraction))], s.vocab, out / f"tokenizer-{s.vocab}")
    ids = held_out_ids(tokenizer, text, s.eval_fraction)
    todo = [(n, seed) for seed in s.seeds for n in names if  # seed-major: an early stop keeps whole seeds
            not any(r["arm"] == n and r["seed"] == seed for r in runs)]
    write_json(path, {"runs": runs, **saved})  # the sizing is kept even if the first run is cut short
    # a run that would end past the budget does not start: the first is judged by the throughput measured
    longest = sizing["estimated_train_s_per_run"] / TRAIN_SHARE if sizing else 0.0
    try:
        for i, (name, seed) in enumerate(tqdm(todo, desc="study", unit="run")):
            if args.budget and time.monotonic() - start + longest > args.budget:
                print(f"the budget of {args.budget:.0f} s is spent: {len(todo) - i} run(s) left; a rerun with the "
                      f"same --out continues them", flush=True)
                break
            t0 = time.monotonic()
            with training_on(where):
                runs.append(one_run(name, table[name], seed, s, tokenizer, ids, out / sc.work, where))
            longest = max(longest, time.monotonic() - t0)
            write_json(path, {"runs": runs, **saved})
            report(runs, s, sc, out, plots_too=False)
    except KeyboardInterrupt:  # scripts/gpu-check's budget: the runs done are written
        report(runs, s, sc, out, plots_too=False)
        return 130
    add_encoding(runs, table, s, out / sc.work)
    write_json(path, {"runs": runs, **saved})
    report(runs, s, sc, out, plots_too=True)
    print((out / f"{sc.stem}.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
