"""`hf-posenc doctor`: the release self-check (hf_posenc.self_check) for every family, on the installed stack.

What a user runs after `pip install -U transformers`, and what a bug report should paste: the versions of
torch, transformers, peft and accelerate against the range hf-posenc was tested on, then one row per model
type and scheme with the checks it passed, then a one-line verdict. Exit 1 when any check fails.
"""

from __future__ import annotations

import argparse
import json
import platform
from importlib import metadata
from typing import Any


def make_parser(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Run the release self-check (own == stock, takes effect, cached == uncached, padded == alone, "
                          "saved and reloaded by plain transformers with today's and earlier versions' remote code, "
                          "unpatch exact) on a tiny model of every family, with the installed libraries. Each verdict "
                          "is kept, so a later patch of that class and scheme on this machine is not checked again.")
    parser.epilog = ("examples:\n  hf-posenc doctor\n  hf-posenc doctor --model-types llama gpt2 --schemes alibi yarn\n"
                     "  hf-posenc doctor --json > doctor.json")
    parser.add_argument("--model-types", nargs="+", metavar="TYPE",
                        help="transformers model types to check (default: one of each family)")
    parser.add_argument("--schemes", nargs="+", metavar="NAME",
                        help="schemes to check (default: each family's own and one per site it supports)")
    parser.add_argument("--json", action="store_true", help="print the versions and rows as JSON")


def check(args: argparse.Namespace) -> None:
    """Unknown schemes and model types are usage errors (exit 2)."""
    from ..config import scheme_name
    from ..errors import PosEncError

    for name in args.schemes or ():
        scheme_name(name)
    if args.model_types:
        from transformers import CONFIG_MAPPING

        unknown = [t for t in args.model_types if t not in CONFIG_MAPPING]
        if unknown:
            raise PosEncError(f"unknown model type(s) {', '.join(map(repr, unknown))}; `hf-posenc list --model-types` "
                              "lists those hf-posenc knows")


def versions() -> dict[str, dict[str, Any]]:
    """Installed version of each library a patched model meets, with the range hf-posenc was tested on."""
    from .. import compat
    from ..version import __version__

    out: dict[str, dict[str, Any]] = {"python": {"installed": platform.python_version()},
                                      "hf-posenc": {"installed": __version__}}
    for name in ("torch", "transformers", "peft", "accelerate"):
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            installed = None
        row: dict[str, Any] = {"installed": installed}
        if name in compat.TESTED_RANGES:
            low, high = compat.TESTED_RANGES[name]
            row.update(tested=f"{low} .. {high}", within=installed is not None and compat.within(installed, low, high))
        out[name] = row
    return out


def rows(model_types: list[str], schemes: list[str] | None) -> list[dict[str, Any]]:
    """One row per model type and scheme: each check's outcome, or why nothing was checked."""
    from .. import self_check
    from ..patching import release_check
    from ..progress import bar

    plan: list[tuple[str, Any, str | None, str]] = []
    for model_type in model_types:
        try:
            model_class = self_check.model_class_for(model_type)
            names = schemes or self_check.default_schemes(model_class, model_type)
        except Exception as exc:  # noqa: BLE001 - a family the installed transformers cannot build is a failed row
            plan.append((model_type, None, None, f"{type(exc).__name__}: {exc}".splitlines()[0][:200]))
            continue
        plan.extend((model_type, model_class, name, "") for name in names)
    out = []
    for model_type, model_class, name, error in bar(plan, desc="doctor", unit="check"):
        row: dict[str, Any] = {"model_type": model_type, "class": getattr(model_class, "__name__", ""),
                               "scheme": name or "", "status": "FAIL", "checks": {}, "seconds": 0.0, "why": error}
        if not error:
            report = release_check(model_class, model_type, self_check.check_config(name))
            row.update(status=report.status, checks={c.name: c.detail or "pass" for c in report.checks},
                       seconds=round(report.seconds, 2), why=report.skipped or report.unchecked or report.failures())
        out.append(row)
    return out


def table(found: dict[str, dict[str, Any]], checked: list[dict[str, Any]]) -> str:
    lines = [f"{name}: {row['installed'] or 'not installed'}"
             + (f" (tested {row['tested']}{'' if row['within'] else ': OUTSIDE'})" if "tested" in row else "")
             for name, row in found.items()]
    lines += ["", "| model type | class | scheme | status | checks passed | s | why |", "|---|---|---|---|---|---|---|"]
    for row in checked:
        passed = sum(v == "pass" for v in row["checks"].values())
        lines.append(f"| {row['model_type']} | {row['class']} | {row['scheme']} | {row['status']} | "
                     f"{passed}/{len(row['checks'])} | {row['seconds']} | {row['why']} |")
    return "\n".join(lines)


def verdict(found: dict[str, dict[str, Any]], checked: list[dict[str, Any]]) -> str:
    """The one line a reader of dozens of rows needs: whether this stack is fine, and if not, what to do."""
    failed = [f"{row['model_type']}/{row['scheme'] or '-'}" for row in checked if row["status"] == "FAIL"]
    skipped = sum(row["status"] == "skipped" for row in checked)
    unchecked = sum(row["status"] == "unchecked" for row in checked)
    outside = [name for name, row in found.items() if "tested" in row and not row["within"]]
    counts = (f"{len(checked) - len(failed) - skipped - unchecked} of {len(checked)} rows passed, {skipped} skipped "
              f"(not applicable)" + (f", {unchecked} could not run (no tiny model: see why)" if unchecked else ""))
    range_note = (f"; {', '.join(outside)} outside the tested range (the rows above are what counts)" if outside
                  else "; every library within the tested range")
    if failed:
        return (f"verdict: NOT OK: {len(failed)} failed ({', '.join(failed[:6])}{', ...' if len(failed) > 6 else ''}); "
                f"hf-posenc refuses those patches on this stack: pin the tested versions or report this output ({counts}"
                f"{range_note})")
    return f"verdict: OK: {counts}{range_note}"


def main(args: argparse.Namespace) -> int:
    import torch
    import transformers

    from .. import self_check

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(min(torch.get_num_threads(), 4))
    found = versions()
    checked = rows(args.model_types or self_check.families(), args.schemes)
    summary = verdict(found, checked)
    print(json.dumps({"versions": found, "rows": checked, "verdict": summary}, indent=1) if args.json
          else f"{table(found, checked)}\n\n{summary}")
    return 1 if any(row["status"] == "FAIL" for row in checked) else 0
