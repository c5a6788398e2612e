"""Which layers and frequencies SmolLM2-135M-Instruct needs positions in, without training: RoPE dropped (NoPE) in
every k-th layer, in the first or last third of the layers, or everywhere; RoPE's low frequencies dropped in
every layer (p-RoPE at p = 0.25 / 0.5 / 0.75, HoPE); against the model as trained (30 layers, theta 1e5).

Each arm records the share of positions kept -- the share of (layer, rotary pair) slots that still rotate:
the fraction of layers keeping RoPE for the NoPE-layer arms, p for p-RoPE, and for HoPE the pairs its
patched rotary keeps over the pairs it rotates (read from the `KeptFrequencies` module the patch
installs: SmolLM2's 32 pairs at theta 1e5 complete a period within 8192 tokens for 20 of them, 0.625).
Then same-target perplexity at 512 and 2048 tokens on held-out KJV (the tail 2% the smoke recipes hold
out; the same target tokens at both lengths, only the context grows), and RULER niah_single_1 (lm-eval's
generators, KJV haystack) and passkey (one needle per evenly spaced depth) at 2048 and 4096, each rate
with its n and 95% Wilson interval. A task an arm scored 0/n at one length is not run at longer ones (the
cell reads "skipped" with that length). `--recovered LABEL=DIR` adds models `hf-posenc train` saved (e.g.
recipes/smollm2-135m/nope_every4/config_smoke.yaml) as arms marked "after recovery (smoke recipe)".

One process loads the model once and patches it per arm; every cell is written to
benchmarks/results/layers.json as it finishes, lengths in the outer loop so every arm has its short cells
before any arm gets the long ones. Then layers.png (quality against the share kept, a marker per family)
and layers.md.

Cost on 2 idle cores (float32, sdpa; prefill of 2k / 4k tokens ~5.2 / 13.5 s, a greedy answer adds ~1-2 s):
per arm ~50 s of perplexity (8 windows at 512 and 2048), ~70 s per task at 2048 and ~155 s at 4096 with
10 samples, so ~8 minutes an arm and ~1 h 40 min for the 12 arms when no cell is skipped (less for arms
that score 0/10 at 2048), plus ~20 s to load and ~1 min building RULER's prompts once per length.

Run: `.venv/bin/python benchmarks/layers.py [--arms ... --samples N --ppl-lengths ... --task-lengths ...
--recovered LABEL=DIR ...]`; `--report-only` redraws the plot and table from the JSON (of a run stopped
early: cells not reached are "–").
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import hf_posenc
from hf_posenc import plots, results
from hf_posenc.evaluation.suite import METRICS
from hf_posenc.data import long_text
from hf_posenc.evaluation import passkey, perplexity_by_length
from hf_posenc.evaluation.ruler import HAYSTACK, ruler_scores
from hf_posenc.loading import load
from hf_posenc.schemes.p_rope import KeptFrequencies

OUT = Path(__file__).parent / "results" / "layers.json"
LAYERS = 30  # SmolLM2-135M-Instruct's decoder layers
NIAH = "ruler niah_single_1"
GEN_TOKENS = 16  # the needle's 7-digit number is ~8 SmolLM2 tokens (as in ruler_smollm2.py)
RECOVERED = "after recovery (smoke recipe)"


@dataclasses.dataclass(frozen=True)
class Arm:
    """A family (one marker in the plot), the scheme patched in, its options and the layers it patches
    (None: every layer)."""

    family: str
    scheme: str | None = None
    options: tuple[tuple[str, Any], ...] = ()
    layers: tuple[int, ...] | None = None

    def patch_kwargs(self) -> dict[str, Any]:
        return {**dict(self.options), **({} if self.layers is None else {"layers": list(self.layers)})}


def every(k: int) -> tuple[int, ...]:
    """Layers k-1, 2k-1, ...: NoPE in every k-th layer, the others keep RoPE."""
    return tuple(i for i in range(LAYERS) if i % k == k - 1)


ARMS: dict[str, Arm] = {
    "original (rope)": Arm("original"),
    **{f"nope 1 in {k} layers": Arm("nope every k-th layer", "nope", layers=every(k)) for k in (2, 3, 4, 6)},
    "nope (all layers)": Arm("nope (all layers)", "nope"),
    "nope first third (0-9)": Arm("nope in a third", "nope", layers=tuple(range(0, 10))),
    "nope last third (20-29)": Arm("nope in a third", "nope", layers=tuple(range(20, 30))),
    **{f"p-rope {p}": Arm("p-rope", "p_rope", (("p", p),)) for p in (0.25, 0.5, 0.75)},
    "hope": Arm("hope", "hope"),
}
# family -> (marker, colour) in the plot
FAMILIES = {"original": ("*", "black"), "nope every k-th layer": ("o", "tab:blue"),
            "nope in a third": ("s", "tab:cyan"), "nope (all layers)": ("X", "tab:red"),
            "p-rope": ("^", "tab:green"), "hope": ("D", "tab:purple"), RECOVERED: ("P", "tab:orange")}


def _rotating_pairs(model: torch.nn.Module) -> float:
    """The share of rotary pairs the patched rotary (p-RoPE, HoPE) keeps rotating."""
    kept = [m.kept / m.rotary.rotated_pairs for m in model.modules() if isinstance(m, KeptFrequencies)]
    return sum(kept) / len(kept)


# scheme -> the share of its rotary pairs that still rotate in a layer it patches
FREQUENCIES_KEPT: dict[str, Callable[[torch.nn.Module], float]] = {
    "nope": lambda model: 0.0, "p_rope": _rotating_pairs, "hope": _rotating_pairs}


def share_kept(model: torch.nn.Module) -> float | None:
    """The share of (layer, rotary pair) slots that still rotate by position; None for a scheme that is no
    subset of RoPE's rotations or a layer map (no one share to speak of)."""
    if not hf_posenc.describe(model):
        return 1.0
    posenc = model.config.posenc
    if posenc.get("scheme") not in FREQUENCIES_KEPT:  # a layer map has no one scheme
        return None
    layers = posenc.get("layers")
    patched = 1.0 if layers is None else len(layers) / model.config.num_hidden_layers
    return 1.0 - patched * (1.0 - FREQUENCIES_KEPT[posenc["scheme"]](model))


@dataclasses.dataclass
class Bench:
    """What every cell is measured with."""

    tokenizer: Any
    held_out: torch.Tensor
    ppl_lengths: list[int]
    samples: int
    windows: int

    @property
    def target(self) -> int:
        """Same-target perplexity: tokens scored per window, half the shortest length (256 by default)."""
        return min(self.ppl_lengths) // 2


def _perplexity(bench: Bench, model: torch.nn.Module, length: int) -> dict[str, Any]:
    return perplexity_by_length(model, bench.held_out, [length], mode="same_target", target=bench.target,
                                longest=max(bench.ppl_lengths), max_windows=bench.windows)[length]


def _niah(bench: Bench, model: torch.nn.Module, length: int) -> dict[str, Any]:
    task = NIAH.removeprefix("ruler ")
    return ruler_scores(model, bench.tokenizer, [task], [length], bench.samples, gen_tokens=GEN_TOKENS)[task][length]


def _passkey(bench: Bench, model: torch.nn.Module, length: int) -> dict[str, Any]:
    depths = [i / max(1, bench.samples - 1) for i in range(bench.samples)]  # n = samples, one needle per depth
    return passkey(model, bench.tokenizer, [length], depths, trials=1)[length]


# metric table -> (how a cell is measured, whether it runs at the perplexity lengths or the task lengths)
MEASURES: dict[str, tuple[Callable[[Bench, torch.nn.Module, int], dict[str, Any]], str]] = {
    "perplexity": (_perplexity, "ppl_lengths"), NIAH: (_niah, "task_lengths"), "passkey": (_passkey, "task_lengths")}


def held_out(tokenizer: Any) -> torch.Tensor:
    """The tail 2% of the KJV's tokens: what the smoke recipes hold out (data.eval_fraction 0.02)."""
    ids = tokenizer(long_text("kjv"), add_special_tokens=False, return_tensors="pt")["input_ids"][0]
    return ids[int(ids.numel() * 0.98):]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--ppl-lengths", default="512,2048", help="same-target perplexity lengths (tokens)")
    parser.add_argument("--task-lengths", default="2048,4096", help="niah_single_1 and passkey lengths (tokens)")
    parser.add_argument("--samples", type=int, default=10, help="prompts per task and length (n)")
    parser.add_argument("--windows", type=int, default=8, help="perplexity windows (places of the text) per length")
    parser.add_argument("--recovered", action="append", default=[], metavar="LABEL=DIR",
                        help="a folder `hf-posenc train` saved, scored as an extra arm; repeatable")
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--resume", action="store_true",
                        help="keep the cells --out already holds (same settings) and measure only the missing ones")
    parser.add_argument("--report-only", action="store_true",
                        help="only redraw the plot and table from --out (e.g. of a run stopped at the deadline)")
    args = parser.parse_args()
    if not args.report_only:
        run(args)
    write_report(results.load(args.out), Path(args.out))


def run(args: argparse.Namespace) -> None:
    """Every arm x metric x length, lengths outermost; each cell saved as it finishes."""
    ints = lambda text: [int(n) for n in text.split(",") if n]  # noqa: E731
    ppl_lengths, task_lengths = ints(args.ppl_lengths), ints(args.task_lengths)
    recovered = dict(spec.split("=", 1) for spec in args.recovered)
    arms = {label: ARMS[label] for label in args.arms.split(",") if label}
    folders = {f"{label}, {RECOVERED}": folder for label, folder in recovered.items()}
    arms.update({label: Arm(RECOVERED) for label in folders})
    torch.manual_seed(0)
    model, tokenizer = load("smollm2", dtype=torch.float32)
    bench = Bench(tokenizer, held_out(tokenizer), ppl_lengths, args.samples, args.windows)
    out = Path(args.out)
    record = _record(args, out, bench, folders)
    runs = {run.label: run for run in record.runs}
    for label, arm in arms.items():
        if label not in runs:
            runs[label] = results.Run(label, arm.scheme, arm.patch_kwargs())
            record.runs.append(runs[label])
    out.parent.mkdir(parents=True, exist_ok=True)
    zero_at: dict[tuple[str, str], int] = {}  # (arm, metric) -> the length it scored 0/n at
    for length in sorted({*ppl_lengths, *task_lengths}):
        for label, arm in arms.items():
            arm_model = _recovered(folders[label]) if label in folders else _patched(model, arm)
            runs[label].posenc = arm_model.config.posenc if hf_posenc.describe(arm_model) else None
            runs[label].scheme = runs[label].posenc.get("scheme") if runs[label].posenc else None  # a folder's too
            record.details["arms"][label] = {"family": arm.family, "share_kept": share_kept(arm_model)}
            for metric, (measure, lengths) in MEASURES.items():
                if length not in {"ppl_lengths": ppl_lengths, "task_lengths": task_lengths}[lengths]:
                    continue
                if (label, metric) in zero_at:
                    runs[label].put(metric, length, {"skipped": f"0/{args.samples} at {zero_at[label, metric]}"})
                    continue
                if (done := runs[label].metrics.get(metric, {}).get(str(length))) is not None:  # --resume
                    if "skipped" not in done and done.get(METRICS[metric].rate or "") == 0:
                        zero_at[label, metric] = length
                    continue
                start = time.perf_counter()
                cell = measure(bench, arm_model, length)
                cell["seconds"] = round(time.perf_counter() - start, 1)
                rate = METRICS[metric].rate
                if rate is not None and cell.get(rate) == 0:
                    zero_at[label, metric] = length
                runs[label].put(metric, length, cell)
                record.save(out)
                print(f"{label:<26} {metric:<20} {length:>5}: {_shown(metric, cell)}  ({cell['seconds']} s)",
                      flush=True)
    record.save(out, complete=True)


def _record(args: argparse.Namespace, out: Path, bench: Bench, folders: dict[str, str]) -> results.Results:
    """A new results record, or with --resume the one at `out` when it was measured with the same settings."""
    settings = {
        "ppl_lengths": bench.ppl_lengths, "task_lengths": [int(n) for n in args.task_lengths.split(",") if n],
        "samples": args.samples, "perplexity": {"mode": "same_target", "target": bench.target,
                                                "windows": args.windows, "text": "kjv held-out (tail 2%)"},
        "gen_tokens": GEN_TOKENS, "haystack": HAYSTACK, "seed": 0, "dtype": "float32"}
    if not (args.resume and out.exists()):
        return results.Results("eval", "smollm2", settings={**settings, "recovered": folders,
                                                           "threads": torch.get_num_threads()}, details={"arms": {}})
    record = results.load(out)
    if changed := sorted(k for k, v in settings.items() if record.settings.get(k) != v):
        raise SystemExit(f"--resume: {out} was measured with other {', '.join(changed)}; use another --out")
    record.settings["recovered"] = {**record.settings.get("recovered", {}), **folders}
    return record


def _patched(model: torch.nn.Module, arm: Arm) -> torch.nn.Module:
    """The packaged SmolLM2 re-patched in place for `arm`."""
    hf_posenc.unpatch(model)
    if arm.scheme is not None:
        hf_posenc.patch(model, arm.scheme, **arm.patch_kwargs())
    return model


@functools.cache
def _recovered(folder: str) -> torch.nn.Module:
    return hf_posenc.from_pretrained(folder, dtype=torch.float32).eval()


def _shown(metric: str, cell: dict[str, Any] | None) -> str:
    """A cell as the table prints it: perplexity to 4 digits, a rate with its interval and n."""
    if cell is None:
        return "–"
    if "skipped" in cell:
        return f"skipped ({str(cell['skipped'])[:60]})"
    rate = METRICS[metric].rate
    return f"{cell['perplexity']:.4g}" if rate is None else results.format_rate(cell[rate], cell["n"], cell["low"],
                                                                                 cell["high"])


def write_report(record: results.Results, out: Path) -> None:
    """The Markdown table (a row per arm, a column per metric and length) and the plot."""
    columns = [(metric, length) for metric, (_, lengths) in MEASURES.items() for length in record.settings[lengths]]
    lines = ["| arm | family | share of positions kept | " + " | ".join(
                 f"{'niah_single_1' if metric == NIAH else metric} @ {length}" for metric, length in columns) + " |",
             "|---|---|---|" + "---|" * len(columns)]
    for run in record.runs:
        arm = record.details["arms"].get(run.label, {})
        share = arm.get("share_kept")
        cells = [_shown(metric, run.metrics.get(metric, {}).get(str(length))) for metric, length in columns]
        lines.append(f"| {run.label} | {arm.get('family', '–')} | {'–' if share is None else f'{share:.3f}'} | "
                     + " | ".join(cells) + " |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    _plot(record, out.with_suffix(".png"))


def _short(label: str) -> str:
    """An arm's label in the plot: a recovered arm's recipe dropped (its marker says it), its other qualifiers kept
    (the fine-tuned control and the original were both "original" once)."""
    label = label.replace("original (rope), same fine-tuning (control)", "rope, fine-tuned (control)")
    return f"{label.removesuffix(f', {RECOVERED}')}, recovered" if label.endswith(RECOVERED) else label


def _annotations(points: list[tuple[str, float, float]], right: float) -> list[tuple[str, tuple[float, float], str]]:
    """(text, offset in points, alignment) of each (label, x, y) given in points on the page, for one panel: texts
    made distinct (a label met twice gets its count); each goes to the first free place near its point (right of
    it, else left, a line up or down, then further out), left of it near the panel's `right` edge, where a
    clipped text once read "original" for two different arms."""
    seen: dict[str, int] = {}
    boxes: list[tuple[float, float, float, float]] = []
    notes = []
    for label, x, y in points:
        seen[_short(label)] = seen.get(_short(label), 0) + 1
        text = _short(label) if seen[_short(label)] == 1 else f"{_short(label)} #{seen[_short(label)]}"
        width = 3.3 * len(text)  # 6-point text, average glyph
        sides = ("left",) if x + 5 + width > right else ("right", "left")
        tries = [(side, dy) for step in range(12) for dy in ((3.0 + 9 * step, -9.0 - 9 * step) if step else (3.0, -9.0))
                 for side in sides]

        def free(side: str, dy: float) -> bool:
            x0 = x + 5 if side == "right" else x - 5 - width
            return not any(x0 < bx1 and bx0 < x0 + width and y + dy < by1 and by0 < y + dy + 8
                           for bx0, by0, bx1, by1 in boxes)

        side, dy = next((t for t in tries if free(*t)), tries[0])
        x0 = x + 5 if side == "right" else x - 5 - width
        boxes.append((x0, y + dy, x0 + width, y + dy + 8))
        notes.append((text, (5.0 if side == "right" else -5.0, dy), "left" if side == "right" else "right"))
    return notes


def _plot(record: results.Results, path: Path) -> None:
    """Quality against the share of positions kept, a column per metric (perplexity on a log scale, niah and
    passkey with their 95% intervals) and a row per length; a marker per family. A cell skipped after 0/n at a
    shorter length, or not reached, has no point."""
    ppl, tasks = record.settings["ppl_lengths"], record.settings["task_lengths"]
    columns = [("perplexity", "perplexity", ppl, "perplexity (held-out KJV)"),
               (NIAH, "score", tasks, "niah_single_1 score"), ("passkey", "accuracy", tasks, "passkey accuracy")]
    rows = max(len(ppl), len(tasks))
    fig, axes = plots.pyplot().subplots(rows, 3, figsize=(16, 4.5 * rows), squeeze=False)
    handles: dict[str, Any] = {}
    for column, (metric, field, lengths, shown) in enumerate(columns):
        for row in range(rows):
            ax = axes[row][column]
            if row >= len(lengths):
                ax.set_axis_off()
                continue
            points = []
            for run in record.runs:
                arm = record.details["arms"].get(run.label, {})
                cell = run.metrics.get(metric, {}).get(str(lengths[row]), {})
                if field not in cell or arm.get("share_kept") is None:
                    continue
                x, y = arm["share_kept"], cell[field]
                yerr = [[y - cell["low"]], [cell["high"] - y]] if "low" in cell else None
                marker, colour = FAMILIES[arm["family"]]
                handles[arm["family"]] = ax.errorbar([x], [y], yerr=yerr, marker=marker, color=colour,
                                                     linestyle="none", capsize=3, markersize=8)
                points.append((run.label, x, y))
            ax.set(xlabel="share of positions kept (layers x rotary pairs still rotating)", ylabel=shown,
                   title=f"{shown} @ {lengths[row]} tokens", xlim=(-0.05, 1.1))
            if metric == "perplexity":
                ax.set_yscale("log")
            else:
                ax.set_ylim(-0.05, 1.05)
            to_points = lambda xy: ax.transData.transform(xy) * 72 / fig.dpi  # noqa: E731
            placed = [(label, *to_points((x, y))) for label, x, y in points]
            right = (ax.transAxes.transform((1, 0)) * 72 / fig.dpi)[0]
            for (text, offset, align), (_, x, y) in zip(_annotations(placed, right), points):
                note = ax.annotate(text, (x, y), fontsize=6, textcoords="offset points", xytext=offset, ha=align)
                note.set_in_layout(False)  # a long label must not squeeze the panel
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=len(handles), fontsize=8)
    fig.suptitle(f"SmolLM2-135M-Instruct: where it needs positions (rates: 95% Wilson interval, n={record.settings['samples']};"
                 " no point: skipped after 0/n at a shorter length)")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    plots.save(fig, path, bbox_inches="tight")


if __name__ == "__main__":
    main()
