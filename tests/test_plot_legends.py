"""Every legend the package and the benchmarks draw sits where it covers no data, no axis label and no title: inside
a panel it hid curves (the study's perplexity panel) and the y-axis label (recovery's bars), issue 61.

Each figure is drawn by the real plotting function on real small data (the benchmarks' committed results, tiny
models for `inspect`), kept as `plots.save` writes it, and measured with the Agg renderer."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
import warnings
from types import ModuleType
from typing import Any

import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from conftest import benchmark_scripts, tiny_model
from test_train import REPO

import hf_posenc as hp
from hf_posenc.evaluation.suite import registered_tables
from hf_posenc import analysis, evaluation, plots, results

RESULTS = REPO / "benchmarks" / "results"


def covered(fig: Any) -> list[str]:
    """What the legends of `fig` cover: a panel's data area, an axis label or a title, or the figure's edge."""
    canvas = FigureCanvasAgg(fig)  # `plots.save` closed the figure and took pyplot's canvas with it
    canvas.draw()
    renderer = canvas.get_renderer()
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend() is not None)]
    found = []
    for legend in legends:
        box = legend.get_window_extent(renderer)
        if not (fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1 and fig.bbox.y0 <= box.y0 and box.y1 <= fig.bbox.y1):
            found.append("the legend runs past the figure's edge")
        for ax in fig.axes:
            parts = {"data area": ax.get_window_extent(renderer)}
            parts |= {name: text.get_window_extent(renderer) for name, text in
                      (("x label", ax.xaxis.label), ("y label", ax.yaxis.label), ("title", ax.title)) if text.get_text()}
            found += [f"the {name} of {ax.get_title() or ax.get_ylabel() or 'a panel'!r}"
                      for name, part in parts.items() if box.overlaps(part)]
        found += [f"the figure's text {text.get_text()!r}" for text in fig.texts
                  if text.get_text() and box.overlaps(text.get_window_extent(renderer))]
    return found


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The figures `plots.save` writes (the real one still writes and closes each), kept to be measured."""
    figures, save = [], plots.save

    def keep(fig: Any, path: str | Path, *args: Any, **kwargs: Any) -> Path:
        figures.append(fig)
        return save(fig, path, *args, **kwargs)

    monkeypatch.setattr(plots, "save", keep)
    return figures


def script(path: str) -> ModuleType:
    """A benchmark script of benchmarks/, imported under a name of its own."""
    spec = importlib.util.spec_from_file_location(f"plotted_{Path(path).stem}", REPO / "benchmarks" / path)
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # its dataclasses look themselves up
    spec.loader.exec_module(module)
    return module


def ids(length: int = 12) -> torch.Tensor:
    return torch.randint(3, 128, (1, length), generator=torch.Generator().manual_seed(0))


def by_length(out: Path) -> None:
    runs = [run for name in ("yarn", "alibi", "t5") for run in evaluation.load_results(RESULTS / "smollm2_16k" / f"{name}.json").runs]
    plots.results_by_length(runs, registered_tables(), out)


def training(out: Path) -> None:
    found = json.loads((RESULTS / "recovery" / "recovery.json").read_text())
    curve = found["arms"]["alibi-lm-lora"]["curve"]
    original = found["baselines"]["original (rope)"]["kjv held-out"]
    plots.loss_curve(curve, out / "loss.png", reference=("step 0", curve[0]["loss"]), curve=curve)
    plots.recovery_curve(curve, out / "curve.png", seq_len=128,
                         reference=dict(original))


def inspected(out: Path) -> None:
    analysis.inspect_model(tiny_model("bert", head="base"), ids(), out / "bert", name="tiny-bert", seeds=3)
    analysis.inspect_model(tiny_model("llama", head="base"), ids(), out / "llama", name="tiny-llama")
    analysis.inspect_model(hp.patch(tiny_model("gpt2", head="base"), "alibi"), ids(), out / "alibi", name="alibi")


def study(out: Path) -> None:
    with benchmark_scripts("study"):
        import run

        runs = json.loads((REPO / "benchmarks" / "study" / "results.json").read_text())["runs"]
        run.draw(runs, out)
        run.draw_geometry(runs, out)


def lengthgen(out: Path) -> None:
    with benchmark_scripts("lengthgen"):
        import report

        found = json.loads((REPO / "benchmarks" / "lengthgen" / "results" / "results.json").read_text())
        report.draw(found["runs"], found["settings"], out)
        report.draw_ranking(found["runs"], found["settings"], out)


def benchmarks(out: Path) -> None:
    script("smollm2_eval.py")._plot(json.loads((RESULTS / "smollm2_eval.json").read_text()), out / "eval.png")
    script("recovery.py").plot(json.loads((RESULTS / "recovery" / "recovery.json").read_text()), out / "recovery.png")
    script("long_context.py").plot(json.loads((RESULTS / "long_context.json").read_text())["results"], out / "long.png")
    saved = json.loads((RESULTS / "seq2seq_lengthgen.json").read_text())
    script("seq2seq_lengthgen.py").figure(saved["arms"], saved["settings"]["test_lengths"], out / "seq2seq.png",
                                          saved["settings"]["task"])
    script("layers.py")._plot(results.load(RESULTS / "layers.json"), out / "layers.png")


# what draws the figures, by name -> how many figures with a legend it draws
DRAWINGS: dict[str, tuple[Callable[[Path], None], int]] = {
    "results_by_length": (by_length, 2), "training": (training, 2), "inspect": (inspected, 6), "study": (study, 2),
    "lengthgen": (lengthgen, 2), "benchmarks": (benchmarks, 5)}


@pytest.mark.parametrize("name", DRAWINGS)
def test_no_legend_covers_data_or_a_label(name: str, drawn: list[Any], tmp_path: Path) -> None:
    draw, legends = DRAWINGS[name]
    draw(tmp_path)
    with_legend = [fig for fig in drawn if fig.legends or any(ax.get_legend() for ax in fig.axes)]
    assert len(with_legend) == legends, f"{name} drew {len(with_legend)} figures with a legend"
    problems = {fig.get_suptitle() or fig.axes[0].get_title(): covered(fig) for fig in with_legend}
    assert not any(problems.values()), {title: found for title, found in problems.items() if found}


def test_the_check_finds_a_legend_inside_a_panel(drawn: list[Any], tmp_path: Path) -> None:
    fig, ax = plots.pyplot().subplots(figsize=(4, 3))
    ax.plot([0, 1], [0, 1], label="a line")
    ax.set_ylabel("a label")
    ax.legend(loc="center left", bbox_to_anchor=(-0.3, 0.5))  # over the y-axis label and the data area
    plots.save(fig, tmp_path / "inside.png")
    assert covered(drawn[0]) == ["the data area of 'a label'", "the y label of 'a label'"]


def test_long_row_names_leave_the_panel_its_width(drawn: list[Any], tmp_path: Path) -> None:
    """An eval of an untrained patched folder names a row 'p1 (its own weights, rope positions) = smollm2
    (original model)': on one legend line it left the panel no width (matplotlib: 'axes sizes collapsed to zero')."""
    runs = [run for name in ("yarn", "alibi") for run in evaluation.load_results(RESULTS / "smollm2_16k" / f"{name}.json").runs]
    long = ["p1 (as loaded)", "p1 (its own weights, rope positions) = smollm2 (original model)"]
    relabelled = [dataclasses.replace(run, label=label) for run, label in zip(runs, long)]
    assert len(relabelled) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plots.results_by_length(relabelled, registered_tables(), tmp_path)
    for fig in drawn:
        fig.canvas.draw()
        panel = fig.axes[0].get_window_extent()
        assert panel.width > 0.4 * fig.bbox.width, (fig.axes[0].get_title(), panel.width, fig.bbox.width)
        assert not covered(fig)
