"""Where models learn: every positional scheme on the length-generalisation tasks of Kazemnejad et al. (NeurIPS 2023,
arXiv 2305.19466), tiny decoders trained from scratch on short instances and scored by exact match on longer ones.

    python benchmarks/lengthgen/run.py --workers 2         # the full study (first tier x 3 seeds, second x 1)
    python benchmarks/lengthgen/run.py --smoke --out /tmp/lg   # 2 arms x 2 tasks x 1 seed, tiny: the pipeline
    python benchmarks/lengthgen/run.py --arms nope,alibi --tasks repeat --seeds 0   # some runs only

Each run (`train.py`) trains one arm (`arms.py`) on one task with the same decoder, data, optimiser and steps
(`settings.py`, set by `pilot.py`), single-threaded; `--workers N` runs N at once. Every finished run is a file
OUT/runs/ARM-TASK-seedS.json; a rerun with the same settings skips those (resumable after a kill) and OUT/results.json
= {"runs": [{"arm", "seed", "task", "iid", "ood_by_length", "gate", ...}], "settings"} is rebuilt from them after
every run, with OUT/results.md and, at the end, OUT/results.png (`report.py`). A run counts only if it reaches the
in-distribution gate (95% exact match); the others are listed, never dropped.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import multiprocessing
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import paper_tasks  # noqa: E402
from arms import Arm, arms  # noqa: E402
from settings import FULL, PAPER, PAPER_SMOKE, SMOKE, Settings  # noqa: E402

from hf_posenc import folders  # noqa: E402
from hf_posenc.errors import PosEncError  # noqa: E402
from hf_posenc.evaluation.lengthgen.tasks import check_lengths, task_of  # noqa: E402

COMMAND = "lengthgen study"  # the marker's command: --out must be new, empty or this study's own


def ints(text: str) -> tuple[int, ...]:
    """'1-20' or '1,2,5' (or both, comma-separated) as integers."""
    out: list[int] = []
    for part in text.split(","):
        low, dash, high = part.partition("-")
        out += list(range(int(low), int(high) + 1)) if dash else [int(part)]
    return tuple(out)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="the smoke budget (settings.SMOKE): < 1 min")
    p.add_argument("--paper", action="store_true", help="at the paper's conditions (settings.PAPER: their task "
                   "splits at their lengths, heads of 64); with --smoke, its smoke budget")
    p.add_argument("--arms", help="comma-separated arms (default: every arm)")
    p.add_argument("--tasks", help="comma-separated tasks (default: the settings')")
    p.add_argument("--seeds", help="seeds of every arm given (default: 3 for the first tier, 1 for the second)")
    p.add_argument("--train-lengths", help="input lengths trained on, e.g. 1-20")
    p.add_argument("--test-lengths", help="input lengths scored past training, e.g. 21-40")
    p.add_argument("--steps", type=int, help="training steps of every run, whatever the task (default: the "
                   "settings', per task)")
    p.add_argument("--lr", type=float, help="peak learning rate of every run (default: the settings')")
    p.add_argument("--batch-size", type=int, help="examples per step (default: the settings')")
    p.add_argument("--positions", type=int, help="rows of the learned table (default: the longest test sequence)")
    p.add_argument("--workers", type=int, default=1, help="runs at once, one thread each (2 on 2 cores)")
    p.add_argument("--out", help="results and runs/ (new, empty, or this study's; default: results/, or paper/ "
                   "with --paper)")
    return p.parse_args(argv)


def settings_of(args: argparse.Namespace) -> Settings:
    s = {(False, False): FULL, (True, False): SMOKE, (False, True): PAPER, (True, True): PAPER_SMOKE}[
        (args.smoke, args.paper)]
    changes: dict[str, Any] = {}
    if args.tasks:
        changes["tasks"] = tuple(args.tasks.split(","))
    for flag in ("train_lengths", "test_lengths"):
        if getattr(args, flag):
            try:
                changes[flag] = ints(getattr(args, flag))
            except ValueError:
                raise PosEncError(f"--{flag.replace('_', '-')} must be integers like 1-20 or 1,2,5, "
                                  f"got {getattr(args, flag)!r}") from None
    for flag in ("positions", "steps", "lr", "batch_size"):
        if getattr(args, flag) is not None:
            changes[flag] = getattr(args, flag)
    if args.steps is not None:  # every task then
        changes["task_steps"] = ()
    return dataclasses.replace(s, **changes)


def plan(args: argparse.Namespace, s: Settings, table: dict[str, Arm]) -> list[tuple[str, str, int]]:
    """Every (arm, task, seed) to run, after every check: nothing is written or trained on bad input."""
    names = args.arms.split(",") if args.arms else [n for n in table if not (s.paper and table[n].table)]
    if unknown := [n for n in names if n not in table]:
        raise PosEncError(f"--arms: unknown arm(s) {', '.join(unknown)}; the arms are {', '.join(table)}")
    for task in s.tasks:
        paper_tasks.task_of(task) if s.paper else task_of(task)
        check_lengths(*s.lengths_of(task))
    if s.paper and (tabled := [n for n in names if table[n].table]):
        raise PosEncError(f"--arms {','.join(tabled)}: a learned table is not an arm of the paper's study (their "
                          "lengths differ by task); allowed: every other arm")
    if args.workers < 1:
        raise PosEncError(f"--workers must be at least 1, got {args.workers}")
    if s.positions < 0 or (s.positions and s.positions < 2):
        raise PosEncError(f"--positions must be a positive number of positions, got {s.positions}")
    for flag, value in (("steps", s.steps), ("batch-size", s.batch_size)):
        if value < 1:
            raise PosEncError(f"--{flag} must be at least 1, got {value}")
    if not 0 < s.lr < 1:
        raise PosEncError(f"--lr must be in (0, 1), got {s.lr}")
    for name in names:
        if table[name].table and s.longest(s.train_lengths) > s.table:
            raise PosEncError(f"--positions {s.table}: the {name} arm's table cannot hold its training sequences "
                              f"({s.longest(s.train_lengths)} tokens at input length {max(s.train_lengths)}); allowed: "
                              f"at least {s.longest(s.train_lengths)}, or train lengths up to {(s.table - 2) // 2}")
    seeds = ints(args.seeds) if args.seeds else None
    return [(name, task, seed) for name in names for seed in (seeds or (s.seeds if table[name].tier == 1
                                                                       else s.seeds_tier2)) for task in s.tasks]


def check_out(out: Path) -> None:
    """--out is new, empty, or a folder this study wrote (a rerun continues it); anything else is refused."""
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and
                                              (folders.read_marker(out) or {}).get("command") != COMMAND)):
        raise PosEncError(f"--out {out}: not a folder this study wrote (no {folders.MARKER} of '{COMMAND}'); "
                          "allowed: a new or empty folder, or a previous --out of this study")


# settings added after the first (2 x 64) study, at their defaults: left out of the budget, so that study's run
# files still match it (resume, and results.md regenerated from them)
ADDED_LATER = {"paper": False, "arm_lr": []}


def budget(s: Settings) -> dict[str, Any]:
    """What makes runs comparable: every setting but which tasks and seeds run."""
    kept = {k: v for k, v in dataclasses.asdict(s).items() if k not in ("tasks", "seeds", "seeds_tier2")}
    kept = json.loads(json.dumps(kept))  # as a run file holds it (tuples as lists), so the two compare equal
    return {k: v for k, v in kept.items() if not (k in ADDED_LATER and v == ADDED_LATER[k])}


def run_file(out: Path, name: str, task: str, seed: int) -> Path:
    return out / "runs" / f"{name}-{task}-seed{seed}.json"


def finished(out: Path, key: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs saved under `out` with these settings, in a stable order."""
    saved = (json.loads(p.read_text()) for p in sorted((out / "runs").glob("*.json")))
    return [r["run"] for r in saved if r["settings"] == key]


def job(name: str, arm: Arm, task: str, seed: int, s: Settings, out: str) -> str:
    """One run in a worker (one thread), saved to its own file (written whole, then renamed)."""
    import torch

    from train import one_run, tokenizer_of

    torch.set_num_threads(1)
    t0, cpu0 = time.perf_counter(), time.process_time()
    run = one_run(name, arm, task, seed, s, tokenizer_of(s), Path(out) / "work" / f"{name}-{task}-seed{seed}")
    run.update(wall_seconds=round(time.perf_counter() - t0, 1), cpu_seconds=round(time.process_time() - cpu0, 1))
    path = run_file(Path(out), name, task, seed)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"settings": budget(s), "run": run}, indent=1))
    tmp.replace(path)
    return f"{name} / {task} / seed {seed}: in distribution {run['iid']['exact_match']:.3f} " \
           f"({'counted' if run['gate'] else 'FAILED the gate'}), out of distribution " \
           f"{run['ood']['exact_match'] if run['ood'] else float('nan'):.3f}, {run['wall_seconds']} s"


def write(out: Path, s: Settings, table: dict[str, Arm], plots_too: bool) -> list[dict[str, Any]]:
    """results.json and results.md from the run files; results.png too at the end."""
    import report

    from hf_posenc.results import write_json

    runs = finished(out, budget(s))
    settings = {**budget(s), "tasks": list(s.tasks), "seeds": list(s.seeds), "seeds_tier2": list(s.seeds_tier2),
                "arms": {n: dataclasses.asdict(a) for n, a in table.items()}}
    write_json(out / "results.json", {"runs": runs, "settings": settings})
    if runs:
        (out / "results.md").write_text(report.summary(runs, settings))
        if plots_too:
            report.draw(runs, settings, out)
            report.draw_ranking(runs, settings, out)
    return runs


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    s = settings_of(args)
    table = arms(s.width)
    todo = plan(args, s, table)
    out = Path(args.out or HERE / ("paper" if args.paper else "results"))
    check_out(out)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    folders.mark(out, COMMAND)
    done = {(r["arm"], r["task"], r["seed"]) for r in finished(out, budget(s))}
    todo = sorted((t for t in todo if t not in done), key=lambda t: t[2])  # seed 0 of every arm first
    print(f"lengthgen study: {len(todo)} run(s) to do, {len(done)} kept, {args.workers} worker(s)", flush=True)
    from tqdm.auto import tqdm

    with tqdm(total=len(todo), desc="lengthgen study", unit="run") as shown:
        if args.workers == 1:
            for name, task, seed in todo:
                shown.write(job(name, table[name], task, seed, s, str(out)))
                shown.update()
                write(out, s, table, plots_too=False)
        else:
            context = multiprocessing.get_context("spawn")
            with concurrent.futures.ProcessPoolExecutor(args.workers, mp_context=context) as pool:
                pending = [pool.submit(job, n, table[n], t, seed, s, str(out)) for n, t, seed in todo]
                for future in concurrent.futures.as_completed(pending):
                    shown.write(future.result())
                    shown.update()
                    write(out, s, table, plots_too=False)
    write(out, s, table, plots_too=True)
    print((out / "results.md").read_text() if (out / "results.md").is_file() else "no run", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
