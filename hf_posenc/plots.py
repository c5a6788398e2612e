"""Every figure hf-posenc draws: results by length, the training loss, and what `inspect` finds.

Functions take plain numbers (results runs, summaries from `hf_posenc.analysis`) and write one PNG
each; nothing here computes a metric. matplotlib is imported on first use, with the Agg backend, so
plotting works on machines without a display.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor

from .results import Plot, Run, Table, described

__all__ = ["DRAWERS", "alibi_bias", "depth_heatmap", "encoding", "four_terms", "heatmap", "legend_outside", "lines",
           "loss_curve", "position_energy", "pyplot", "recovery_curve", "results_by_length", "rotary", "save",
           "series", "shift_fit", "subspace"]


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, path: str | Path, dpi: int = 120, **kwargs: Any) -> Path:
    if "bbox_inches" not in kwargs and fig.get_layout_engine() is None:  # a figure with a layout keeps it
        fig.tight_layout()
    fig.savefig(path, dpi=dpi, **kwargs)
    pyplot().close(fig)
    return Path(path)


LEGEND_WIDTH = 32  # characters a legend line holds: a long row name ("p1 (its own weights, rope positions) =
# smollm2 (original model)") on one line left the panels no width at all


def legend_outside(fig: Any, *axes: Any, **kwargs: Any) -> Any:
    """One legend right of every panel, with the entries of `axes` (default: all of the figure's), each label once,
    wrapped at `LEGEND_WIDTH`. Inside a panel a legend hid curves and the y-axis label; the figure's constrained
    layout makes room for it.

    Args:
        kwargs: passed on to `Figure.legend` (`fontsize`, `ncol`).
    """
    entries: dict[str, Any] = {}
    for ax in axes or fig.axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(textwrap.fill(label, LEGEND_WIDTH), handle)
    fig.set_layout_engine("constrained")
    return fig.legend(list(entries.values()), list(entries), loc="outside right center", **kwargs)


def series(run: Run, metric: str, field: str) -> tuple[list[int], list[float]]:
    """Numeric keys and values of one field of a run's metric table; skipped cells are left out."""
    points = [(int(key), cell[field]) for key, cell in run.cells(metric) if field in cell]
    return [p[0] for p in points], [p[1] for p in points]


# ---------------------------------------------------------------- results

MARKERS = "osD^v<>p*h"


def dodged(runs: Sequence[Run], metric: str, field: str) -> list[tuple[float, str, str]]:
    """(x factor, legend label, marker) per run: a run whose series equals an earlier one's is drawn shifted a
    little along the (log) length axis with its own marker, and its label says whose it equals -- drawn on top
    of each other, one legend entry had no visible line (the original under "yarn x2" on passkey)."""
    seen: list[tuple[Any, str]] = []
    drawn = []
    for run in runs:
        points = series(run, metric, field)
        same = [label for other, label in seen if other == points]
        shift = 2 ** (0.06 * len(same))  # 4% apart per copy on a log2 axis: visible, still at its length
        label = f"{run.label} (same as {same[0]}; shifted)" if same else run.label
        drawn.append((shift, label, MARKERS[len(same) % len(MARKERS)]))
        seen.append((points, run.label))
    return drawn


def results_by_length(runs: Sequence[Run], schemas: Mapping[str, Table], out: str | Path) -> list[Path]:
    """One PNG per `Plot` the runs' metric tables declare in `schemas` (every table with an equal plot in one
    figure, drawn by `DRAWERS[plot.kind]` or the plot's own callable; a kind not known here, a plug-in's drawer
    read back from a file, as lines); tables whose cells were all skipped draw nothing. Returns the files written."""
    out, written = Path(out), []
    figures: dict[Plot, dict[str, Table]] = {}
    for name, table in described(list(runs), schemas):
        if table.plot is not None:
            figures.setdefault(table.plot, {})[name] = table
    for plot, held in figures.items():
        field = plot.field or next(iter(held.values())).fields[0]
        drawn = {name: table for name, table in held.items() if any(series(run, name, field)[0] for run in runs)}
        if drawn:
            draw = DRAWERS.get(plot.kind, lines) if isinstance(plot.kind, str) else plot.kind
            written.append(draw(runs, drawn, out / plot.file, plot))
    return written


def lines(runs: Sequence[Run], tables: Mapping[str, Table], path: Path, plot: Plot) -> Path:
    """A line per run and table over the numeric keys, the rate's 95% Wilson interval as error bars."""
    plt, names = pyplot(), list(tables)
    field = plot.field or tables[names[0]].fields[0]
    fig, ax = plt.subplots(figsize=(6, 4))
    for name in names:
        drawn = [run for run in runs if series(run, name, field)[0]]
        for run, (shift, label, marker) in zip(drawn, dodged(drawn, name, field)):
            keys, values = series(run, name, field)
            keys = [key * shift for key in keys]
            if len(names) > 1:
                label = f"{run.label} {name}{label.removeprefix(run.label)}"
            bounds = [(cell["low"], cell["high"]) for _, cell in run.cells(name) if field in cell and "low" in cell]
            if len(bounds) == len(values):
                errors = [[v - lo for v, (lo, _) in zip(values, bounds)], [hi - v for v, (_, hi) in zip(values, bounds)]]
                ax.errorbar(keys, values, yerr=errors, marker=marker, capsize=3, label=label)
            else:
                ax.plot(keys, values, marker=marker, label=label)
    ax.set(xlabel=plot.xlabel, ylabel=plot.ylabel, title=plot.title)
    if plot.log_y:
        ax.set_yscale("log")
    elif tables[names[0]].rate == field:
        ax.set_ylim(-0.05, 1.05)
    if plot.log_x:
        ax.set_xscale("log", base=2)
    legend_outside(fig, fontsize=8)
    return save(fig, path)


def depth_heatmap(runs: Sequence[Run], tables: Mapping[str, Table], path: Path, plot: Plot) -> Path:
    """One run: a length x depth heat-map of each cell's `by_depth` rates; several: `lines`."""
    names = list(tables)
    drawn = [run for run in runs if any(series(run, name, plot.field)[0] for name in names)]
    if len(drawn) != 1:
        return lines(drawn, tables, path, plot)
    run, plt = drawn[0], pyplot()
    cells = {int(key): cell for key, cell in run.cells(names[0]) if "by_depth" in cell}
    lengths = sorted(cells)
    depths = sorted({float(d) for cell in cells.values() for d in cell["by_depth"]})
    grid = [[{float(d): acc for d, acc in cells[L]["by_depth"].items()}.get(d, float("nan")) for L in lengths]
            for d in depths]
    fig, ax = plt.subplots(figsize=(1.2 * len(lengths) + 2, 0.6 * len(depths) + 1.5))
    image = ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
    for i, row in enumerate(grid):
        for j, value in enumerate(row):
            ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(lengths)), [str(L) for L in lengths])
    ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths])
    ax.set(xlabel=plot.xlabel, ylabel="needle depth", title=f"{plot.title}: {run.label}")
    fig.colorbar(image, ax=ax, label=plot.ylabel)
    return save(fig, path)


def heatmap(runs: Sequence[Run], tables: Mapping[str, Table], path: Path, plot: Plot) -> Path:
    """One heat-map of rates: a row per run and table, a column per key, each cell its value and 95% Wilson
    interval (n in the title when all cells share it); rows name the table without the words all share."""
    names = list(tables)
    plt, field = pyplot(), plot.field or tables[names[0]].fields[0]
    rows = [(run, m) for run in runs for m in names if run.metrics.get(m)]
    lengths = sorted({int(key) for run, m in rows for key, _ in run.cells(m)})
    cells = [[run.metrics[m].get(str(L), {}) for L in lengths] for run, m in rows]
    fig, ax = plt.subplots(figsize=(1.6 * len(lengths) + 4, 0.45 * len(rows) + 1.6))
    image = ax.imshow([[c.get(field, float("nan")) for c in row] for row in cells], vmin=0, vmax=1,
                      cmap="RdYlGn", aspect="auto")
    for i, row in enumerate(cells):
        for j, cell in enumerate(row):
            text = (f"{cell[field]:.2f} [{cell['low']:.2f}, {cell['high']:.2f}]" if "low" in cell
                    else "skipped" if "skipped" in cell else "")
            ax.text(j, i, text, ha="center", va="center", fontsize=8)
    ns = {cell["n"] for row in cells for cell in row if "n" in cell}
    shared = os.path.commonprefix(list(names))
    prefix = shared[:shared.rfind(" ") + 1]  # "ruler " of "ruler niah_single_1", "ruler vt"
    ax.set_xticks(range(len(lengths)), [str(L) for L in lengths])
    ax.set_yticks(range(len(rows)), [f"{run.label}: {m.removeprefix(prefix)}" for run, m in rows])
    ax.set(xlabel=plot.xlabel, title=f"{plot.title} [95% Wilson interval]" + (f", n={ns.pop()} per cell"
                                                                                if len(ns) == 1 else ""))
    fig.colorbar(image, ax=ax, label=plot.ylabel)
    return save(fig, path, bbox_inches="tight")


# how a `Plot` of a metric table is drawn, by its `kind`
DRAWERS: dict[str, Callable[[Sequence[Run], Mapping[str, Table], Path, Plot], Path]] = {
    "lines": lines, "depth_heatmap": depth_heatmap, "heatmap": heatmap}


def loss_curve(log: Sequence[dict[str, float]], path: str | Path, *, reference: tuple[str, float] | None = None,
               points: Sequence[tuple[str, int, float]] = (), curve: Sequence[dict[str, Any]] = ()) -> Path:
    """Training loss by step; `reference` a horizontal line (label, loss), `points` held-out (label, step, loss),
    `curve` the held-out loss every N steps (`hf_posenc.train.curve`)."""
    fig, ax = pyplot().subplots(figsize=(6, 3.5))
    ax.plot([r["step"] for r in log], [r["loss"] for r in log], label="train loss")
    if curve:
        ax.plot([r["step"] for r in curve], [r["loss"] for r in curve], "-.", marker=".", label="held-out loss")
    if reference:
        ax.axhline(reference[1], color="gray", linestyle="--", label=f"{reference[0]}: {reference[1]:.3f}")
    for (label, step, loss), marker in zip(points, "os^"):
        ax.plot([step], [loss], marker, label=f"{label}: {loss:.3f}")
    ax.set(xlabel="optimizer step", ylabel="loss")
    legend_outside(fig)
    return save(fig, path)


def recovery_curve(curve: Sequence[dict[str, Any]], path: str | Path, *, reference: Mapping[str, float] | None = None,
                   seq_len: int | None = None, held_out: str = "the held-out text",
                   final: tuple[int, dict[str, float]] | None = None) -> Path:
    """Held-out perplexity against optimizer steps, one line per scored window length (tokens on the top axis,
    training CPU seconds at the last point: the three grow together, so one panel shows them); `reference` the
    original model's perplexity by length (dotted), `final` (step, perplexity by length) the evaluation after training. The
    axes say which tokens are scored: every token of windows of the recipe's held-out text, which is not what
    the eval and demo tables score (fixed target tokens after a growing context)."""
    fig, ax = pyplot().subplots(figsize=(7.5, 4.8))
    lengths = sorted({length for row in curve for length in row["perplexity"]}, key=int)
    for length in lengths:
        rows = [r for r in curve if length in r["perplexity"]]
        steps, values = [r["step"] for r in rows], [r["perplexity"][length] for r in rows]
        if final is not None and length in final[1] and final[0] not in steps:
            steps, values = [*steps, final[0]], [*values, final[1][length]]
        trained = " (the training length)" if str(seq_len) == length else ""
        line, = ax.plot(steps, values, marker="o", ms=3, label=f"windows of {length} tokens{trained}")
        if reference and length in reference:
            ax.axhline(reference[length], color=line.get_color(), linestyle=":",
                       label=f"before the swap, windows of {length} tokens")
    if curve and curve[-1]["step"]:
        per_step = curve[-1]["tokens"] / curve[-1]["step"]
        top = ax.secondary_xaxis("top", functions=(lambda s: s * per_step, lambda n: n / per_step))
        top.set_xlabel("training tokens")
        ax.annotate(f"{curve[-1]['cpu_s']:.3g} training CPU-s", (curve[-1]["step"], curve[-1]["perplexity"][lengths[0]]),
                    textcoords="offset points", xytext=(4, 6), fontsize=7)
    ax.set(xlabel="optimizer step", yscale="log", ylabel="held-out perplexity")
    legend_outside(fig, fontsize=7)
    fig.suptitle(f"Recovery curve on {held_out}\nevery token of each window scored; the eval and demo tables score fixed "
                 "target\ntokens after a growing context: other tokens, so other numbers", fontsize=8)
    return save(fig, path)


# ---------------------------------------------------------------- inspect


def subspace(geo: dict[str, Any], path: str | Path, title: str) -> Path:
    """Principal angles between the token and position subspaces against random ones, and the share of
    position energy inside each (`hf_posenc.analysis.subspace_geometry`)."""
    fig, (ax, bx) = pyplot().subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [2.2, 1]})
    idx = range(1, len(geo["angles_deg"]) + 1)
    mean, std = torch.tensor(geo["random"]["angles_deg_mean"]), torch.tensor(geo["random"]["angles_deg_std"])
    ax.fill_between(idx, mean - std, mean + std, color="0.8", label=f"random {geo['top_k']}-dim subspaces (mean +- std)")
    ax.plot(idx, mean, color="0.5")
    ax.plot(idx, geo["angles_deg"], "o-", color="C3", label="token subspace")
    ax.set(xlabel=f"principal angle index (position subspace: top {geo['pos_dim']} directions)",
           ylabel="angle (degrees)", ylim=(0, 90), title="principal angles: position vs token subspace")
    rand = geo["random"]["position_energy_in_token_subspace"]
    bx.bar([0, 1], [geo["position_energy_in_token_subspace"], rand["mean"]], yerr=[0, rand["std"]],
           color=["C3", "0.6"], tick_label=["token\nsubspace", "random\nsubspace"])
    bx.axhline(rand["expected"], ls="--", color="0.3", lw=1, label=f"k/d = {rand['expected']:.2f}")
    bx.set(ylim=(0, 1), title="position energy inside", ylabel="share of squared norm")
    legend_outside(fig)
    fig.suptitle(f"{title}: token top-{geo['top_k']} of d={geo['d']} vs positions 0..{geo['num_positions'] - 1}")
    return save(fig, path, dpi=110)


def four_terms(summary: dict[str, Any], terms: Sequence[str], bias_terms: Sequence[str], path: str | Path,
               title: str) -> Path:
    """Per head, each logit term's share (`FourTerms.summary`), the bias terms summed into one column."""
    plt = pyplot()
    columns = [*terms, f"bias terms ({len(bias_terms)})"]
    fig, axes = plt.subplots(1, 2, figsize=(2.4 * len(columns) + 2, 0.45 * len(summary["share"][terms[0]]) + 2.2))
    for ax, key, label in ((axes[0], "share", "share of mean |logit term|"),
                           (axes[1], "softmax_share", "same, each term centred over keys (what softmax sees)")):
        share = summary[key]
        bias = [sum(v) for v in zip(*(share[t] for t in bias_terms))]
        grid = torch.tensor([share[t] for t in terms] + [bias]).T
        im = ax.imshow(grid, cmap="viridis", vmin=0, vmax=1, aspect="auto")
        for h in range(grid.shape[0]):
            for c in range(grid.shape[1]):
                v = float(grid[h, c])
                ax.text(c, h, f"{v:.2f}", ha="center", va="center", color="w" if v < 0.6 else "k", fontsize=8)
        ax.set_xticks(range(len(columns)), [c.replace("-", "-\n") for c in columns])
        ax.set_yticks(range(grid.shape[0]), [f"head {h}" for h in range(grid.shape[0])])
        ax.set_title(label, fontsize=10)
    fig.colorbar(im, ax=axes, fraction=0.03)
    fig.suptitle(f"{title}: layer-0 attention logit terms ({summary['pairs']} query-key pairs)")
    return save(fig, path, dpi=110, bbox_inches="tight")


def encoding(positions: Tensor, components: Tensor, by_distance: dict[str, list[float]], path: str | Path,
             title: str) -> Path:
    """Raw dimensions, then the same vectors in their own principal basis (`components`), where a learned
    table's smooth low-frequency structure shows up, then similarity by distance."""
    fig, axes = pyplot().subplots(1, 3, figsize=(17, 4.2), layout="constrained")  # legend_outside: set before colorbars
    for ax, values, xlabel, name in ((axes[0], positions, "dimension", "position vectors"),
                                     (axes[1], components, "principal direction (by energy)", "in their principal basis")):
        lim = float(values.abs().quantile(0.99))
        im = ax.imshow(values.cpu(), cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto", interpolation="nearest")
        ax.set(xlabel=xlabel, ylabel="position", title=name)
        fig.colorbar(im, ax=ax)
    bx = axes[2]
    bx.plot(by_distance["distance"], by_distance["cosine"], color="C0", label="cosine")
    bx.set(xlabel="distance |i - j|", ylabel="mean cosine", title="position i vs position j")
    bx.axhline(0, color="0.7", lw=0.8)
    tx = bx.twinx()
    tx.plot(by_distance["distance"], by_distance["dot"], color="C1", alpha=0.7, label="dot product")
    tx.set_ylabel("mean dot product")
    legend_outside(fig, bx, tx)
    fig.suptitle(title)
    return save(fig, path, dpi=110)


def alibi_bias(slopes: Sequence[float], max_distance: int, path: str | Path, title: str) -> Path:
    fig, ax = pyplot().subplots(figsize=(6, 4))
    distance = torch.arange(max_distance)
    for h, slope in enumerate(slopes):
        ax.plot(distance, -slope * distance, lw=1, label=f"head {h}: m = {slope:.3g}")
    ax.set(xlabel="distance |query - key|", ylabel="bias added to the logit", title=f"{title}: ALiBi bias by distance")
    legend_outside(fig, fontsize=7, ncol=2)
    return save(fig, path, dpi=110)


def rotary(profile: dict[str, Any], cos: Tensor, path: str | Path, title: str) -> Path:
    """The rotation cos(m theta_j), and the layer-0 and last-layer logit by distance (`rotary_profile`)."""
    fig, axes = pyplot().subplots(1, 3, figsize=(16, 4.2), layout="constrained")  # legend_outside: set before colorbars
    im = axes[0].imshow(cos, cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto", interpolation="nearest")
    axes[0].set(xlabel="frequency index j (fast -> slow)", ylabel="position m", title="cos(m theta_j): the rotation")
    fig.colorbar(im, ax=axes[0])
    d = profile["distances"]
    last = len(profile["layers"]) - 1
    for ax, layer in ((axes[1], 0), (axes[2], last)):
        for h, curve in enumerate(profile["layers"][layer]):
            ax.plot(d, curve, lw=1, label=f"head {h}")
        ax.set(xlabel="distance (query - key)", ylabel="mean logit  qbar R(d) kbar / sqrt(d_h)",
               title=f"layer {layer}: logit by distance, text q/k")
    ref = axes[1].twinx()
    ref.plot(d, profile["reference_ones"], "k--", lw=1)
    ref.set_ylabel("q = k = ones (RoFormer decay), dashed")
    legend_outside(fig, axes[2], fontsize=7, ncol=2)
    fig.suptitle(title)
    return save(fig, path, dpi=110)


def shift_fit(fit: dict[str, Any], path: str | Path, title: str) -> Path:
    """R^2 of PE(p+k) ~ M_k PE(p) by offset k, against a random table and the sinusoidal code's exact 1
    (`hf_posenc.analysis.shift_fit`)."""
    fig, ax = pyplot().subplots(figsize=(6.5, 4.2))
    ax.axhline(1.0, color="C2", ls="--", lw=1, label="sinusoidal code (a rotation: exactly 1)")
    ax.plot(fit["offsets"], fit["r2"], "o-", color="C3", label="this model's positions")
    ax.plot(fit["offsets"], fit["random_r2"], "s-", color="0.6", label="random table, same shape (chance)")
    ax.set(xscale="log", xlabel="offset k (positions)", ylabel="R^2 of the least-squares M_k")
    ax.set_ylim(min(0.0, *fit["r2"], *fit["random_r2"]), 1.05)
    legend_outside(fig, fontsize=8)
    fig.suptitle(f"{title}: is a shift a linear map? (rank {fit['rank']})")  # a panel title ran into the legend
    return save(fig, path, dpi=110)


def position_energy(energy: dict[str, Any], reference: dict[str, Any], path: str | Path, title: str) -> Path:
    """Position variation per embedding dimension, and its cumulative share along the token embedding's
    singular directions, for the model and for the sinusoidal code of the same shape
    (`hf_posenc.analysis.energy_by_direction`)."""
    fig, (ax, bx) = pyplot().subplots(1, 2, figsize=(13, 4.2))
    for data, name, color in ((reference, "sinusoidal code", "C2"), (energy, "this model", "C3")):
        ax.plot(data["per_dimension"]["variation"], color=color, lw=0.8, alpha=0.85, label=name)
        for field, style in (("variation", "-"), ("energy", ":")):
            share = torch.tensor(data["per_token_direction"][field]).cumsum(0)
            bx.plot(share, style, color=color, label=f"{name}: {field}")
    d = len(energy["per_dimension"]["variation"])
    ax.axhline(1 / d, color="0.5", lw=0.8, ls="--", label="uniform 1/d")
    ax.set(xlabel="embedding dimension", ylabel="share of position variation", title="per dimension")
    tokens = torch.tensor(energy["per_token_direction"]["token_energy"]).cumsum(0)
    bx.plot(tokens, color="C0", lw=1, label="token embedding's own energy")
    bx.plot([0, len(tokens) - 1], [1 / len(tokens), 1], color="0.5", lw=0.8, ls="--", label="uniform")
    bx.set(xlabel="token singular direction (largest token energy first)", ylabel="cumulative share",
           title="along the token embedding's directions")
    legend_outside(fig, fontsize=7)
    fig.suptitle(f"{title}: where the position vectors put their energy")
    return save(fig, path, dpi=110)
