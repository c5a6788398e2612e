"""Length generalisation of encoder-decoders: a tiny T5 and a tiny BART trained from scratch with 3 schemes.

Each (model, scheme) arm is the shipped recipe `recipes/<model>-tiny/<task>/config_<scheme>.yaml` run by the
recipe runner (`hf_posenc.train`, model.task seq2seq) on input -> output pairs of 1..L digits, from the same
random init per model (`hf_posenc.tiny_seq2seq`); the saved model is then scored by the `seq2seq_<task>`
suite of `hf-posenc eval` (`hf_posenc.evaluation.run_suites`: greedy generation, exact match) at 1x..4x L,
n pairs per cell with 95% Wilson intervals. The task is Kazemnejad et al. 2023's length-generalisation
setting (train short, test long), on the encoder-decoder side.

    OMP_NUM_THREADS=1 nice python benchmarks/seq2seq_lengthgen.py              # ~10 CPU-minutes
    OMP_NUM_THREADS=1 python benchmarks/seq2seq_lengthgen.py --steps 200 --examples 10 --out /tmp/s2s   # quick

Writes OUT/seq2seq_lengthgen.json (every cell, the settings, training seconds), .md (the table) and .png.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from hf_posenc import plots, results  # noqa: E402
from hf_posenc.data import seq2seq_pairs  # noqa: E402
from hf_posenc.evaluation import SuiteSettings, run_suites, seq2seq_length_generalization  # noqa: E402
from hf_posenc.loading import load  # noqa: E402
from hf_posenc.stats import rate_fields  # noqa: E402
from hf_posenc.tiny_seq2seq import write_task  # noqa: E402
from hf_posenc.train import load_recipe, train  # noqa: E402

MODELS = ("t5", "bart")
SCHEMES = ("t5", "rope", "alibi")  # schemes both families take (t5 is T5's own)


def test_lengths(train_max: int) -> list[int]:
    """1x..4x the longest trained input, with steps of a quarter near it, where a scheme's reach shows first."""
    return sorted({round(train_max * k) for k in (1, 1.25, 1.5, 2, 3, 4)})


def arm(model_type: str, scheme: str, assets: dict[str, Path], work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Train one recipe, then score the saved model at 1x..4x the training length."""
    recipe_path = REPO / "recipes" / f"{model_type}-tiny" / args.task / f"config_{scheme}.yaml"
    out = work / f"{model_type}-{scheme}"
    recipe = load_recipe(recipe_path, ["--model_name_or_path", str(assets["model"]), "--dataset_name", str(assets["data"]),
                                       "--output_dir", str(out), "--max_steps", str(args.steps),
                                       "--plot", "false"])
    start = time.process_time()
    record = train(recipe, overwrite=out.exists())
    train_cpu = time.process_time() - start
    held_out = record.run("after training").metrics["seq2seq"][str(assets["data"])]
    model, tokenizer = load(str(out), task="seq2seq")
    lengths = test_lengths(args.train_max)
    settings = SuiteSettings([f"seq2seq_{args.task}"], [args.train_max], name=f"{model_type} {scheme}",
                             synthetic={"task_lengths": lengths, "examples": args.examples}, seed=0)
    scored = run_suites(model, tokenizer, settings, work / f"eval-{model_type}-{scheme}")
    cells = scored.runs[0].metrics[f"seq2seq_{args.task}"]
    for length in lengths:  # what the misses are: too short an answer (the EOS decision), or wrong digits
        cells[str(length)].update(answer_shape(model, tokenizer, args.task, length, args.examples, args.train_max,
                                               cells[str(length)]["exact_match"]))
    return {"model": model_type, "scheme": scheme, "recipe": str(recipe_path.relative_to(REPO)),
            "train_cpu_s": round(train_cpu, 1), "final_train_loss": record_loss(out),
            "held_out": {k: held_out[k] for k in ("exact_match", "n", "low", "high", "loss")}, "by_length": cells}


def answer_shape(model: Any, tokenizer: Any, task: str, length: int, n: int, trained: int,
                 exact_match: float) -> dict[str, Any]:
    """The suite's pairs generated again (the same exact match, checked): the mean answer length in digits, and
    the rate of answers whose first `trained` digits are right (the part the model was trained to write)."""
    pairs = seq2seq_pairs(task, length, n, seed=0)
    again = seq2seq_length_generalization(model, tokenizer, pairs, batch_size=8)
    assert again["exact_match"] == exact_match, (again["exact_match"], exact_match)
    answers = ["".join(p.split()) for p in again["predictions"]]
    targets = ["".join(t.split()) for t in pairs["target"]]
    prefix = sum(a[:trained] == t[:trained] for a, t in zip(answers, targets))
    return {"mean_answer_digits": sum(map(len, answers)) / n, "prefix_match": prefix / n,
            "prefix": {"digits": trained, **rate_fields(prefix, n)}}


def held_out(a: dict[str, Any]) -> str:
    h = a["held_out"]
    return (f"{a['model']} {a['scheme']} {results.format_rate(h['exact_match'], h['n'], h['low'], h['high'])} "
            f"({a['train_cpu_s']:.0f} CPU-s training)")


def record_loss(out: Path) -> float:
    return json.loads((out / "loss.json").read_text())[-1]["loss"]


def table(arms: list[dict[str, Any]], lengths: list[int], prefix: bool = False) -> str:
    """Exact match per (model, scheme) and length; `prefix`: the first-L-digits match and mean answer length."""
    head = "| model | scheme | " + " | ".join(f"{L} digits" + (" (train max)" if i == 0 else "")
                                              for i, L in enumerate(lengths)) + " |"
    lines = [head, "|---|---|" + "---|" * len(lengths)]
    for a in arms:
        cells = [a["by_length"][str(L)] for L in lengths]
        if prefix:
            text = [f"{results.format_rate(c['prefix_match'], c['n'], c['prefix']['low'], c['prefix']['high'])}, "
                    f"{c['mean_answer_digits']:.1f} digits" for c in cells]
        else:
            text = [results.format_rate(c["exact_match"], c["n"], c["low"], c["high"]) for c in cells]
        lines.append(f"| {a['model']} | {a['scheme']} | " + " | ".join(text) + " |")
    return "\n".join(lines)


def figure(arms: list[dict[str, Any]], lengths: list[int], path: Path, task: str) -> None:
    """Top: exact match by length (95% Wilson bars); bottom: mean answer length against the target's (dashed)
    and the generation cap of target + 2 digits (dotted)."""
    plt = plots.pyplot()
    fig, axes = plt.subplots(2, len(MODELS), figsize=(10, 7), sharex=True)
    for column, model_type in enumerate(MODELS):
        top, bottom = axes[0, column], axes[1, column]
        for a in (a for a in arms if a["model"] == model_type):
            cells = [a["by_length"][str(L)] for L in lengths]
            values = [c["exact_match"] for c in cells]
            errors = [[v - c["low"] for v, c in zip(values, cells)], [c["high"] - v for v, c in zip(values, cells)]]
            top.errorbar(lengths, values, yerr=errors, marker="o", capsize=3, label=a["scheme"])
            bottom.plot(lengths, [c["mean_answer_digits"] for c in cells], marker="o", label=a["scheme"])
        bottom.plot(lengths, lengths, "k--", linewidth=1, label="target length")
        bottom.plot(lengths, [L + 2 for L in lengths], "k:", linewidth=1, label="cap (target + 2)")
        for ax in (top, bottom):
            ax.axvline(lengths[0], color="grey", linestyle=":", linewidth=1)
        top.set(title=f"tiny {model_type}: {task}", ylim=(-0.05, 1.05))
        bottom.set(xlabel="digits (grey: longest trained)", xticks=lengths)
    axes[0, 0].set_ylabel("exact match (95% Wilson)")
    axes[1, 0].set_ylabel("mean answer length (digits)")
    plots.legend_outside(fig, fontsize=8)
    plots.save(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="copy", choices=["copy"], help="the task the shipped recipes train")
    parser.add_argument("--train-max", type=int, default=8, help="longest training input (digits); test up to 4x")
    parser.add_argument("--steps", type=int, default=1500, help="optimizer steps per arm (batch 32)")
    parser.add_argument("--examples", type=int, default=50, help="test pairs per length (n per cell)")
    parser.add_argument("--out", default=str(HERE / "results"))
    parser.add_argument("--replot", action="store_true", help="redraw the PNG and table from OUT's JSON, no training")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lengths = test_lengths(args.train_max)
    if args.replot:
        saved = json.loads((out / "seq2seq_lengthgen.json").read_text())
        lengths = saved["settings"]["test_lengths"]
        args.steps, args.train_max = saved["settings"]["steps"], lengths[0]
        write_outputs(saved["arms"], lengths, out, args)
        return
    arms = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for model_type in MODELS:
            assets = write_task(work / f"{model_type}-assets", model_type, args.task, range(1, args.train_max + 1))
            for scheme in SCHEMES:
                arms.append(arm(model_type, scheme, assets, work, args))
                print(f"{model_type} {scheme}: {arms[-1]['by_length']}", flush=True)
    settings = {"task": args.task, "train_lengths": [1, args.train_max], "test_lengths": lengths, "steps": args.steps,
                "batch_size": 32, "examples": args.examples, "eval_seed": 0, "models": MODELS, "schemes": SCHEMES}
    results.write_json(out / "seq2seq_lengthgen.json", {"settings": settings, "versions": results.versions(), "arms": arms})
    write_outputs(arms, lengths, out, args)


def write_outputs(arms: list[dict[str, Any]], lengths: list[int], out: Path, args: argparse.Namespace) -> None:
    md = table(arms, lengths)
    (out / "seq2seq_lengthgen.md").write_text(
        f"Exact match of greedy generation, `{args.task}`, trained on 1..{args.train_max} digits "
        f"({args.steps} steps x 32 pairs, from scratch), tested at 1x..4x (1.25x and 1.5x included); [95% Wilson interval] (n).\n\n{md}\n\n"
        f"The same answers: the rate whose first {args.train_max} digits are right, and the mean answer length "
        f"(generation stops at end-of-sequence or at the target's length + 2 digits).\n\n"
        f"{table(arms, lengths, prefix=True)}\n\n"
        f"Held-out pairs of 1..{args.train_max} digits after training (the recipe run's table, teacher-forced): "
        + "; ".join(held_out(a) for a in arms) + ". CPU-s: the training loop's CPU time, one process each (the "
        "machine's cores and their load were not recorded).\n")
    figure(arms, lengths, out / "seq2seq_lengthgen.png", args.task)
    print(md)


if __name__ == "__main__":
    main()
