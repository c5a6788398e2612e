"""The seq2seq zoo: every encoder-decoder model type of the installed transformers (text seq-to-seq LMs and
speech seq-to-seq models, whose text decoder is the stack patched), built tiny with the causal zoo's
shrink (tests/zoo.py), with the verdict of hf_posenc.seq2seq (which sites its text stacks take, or why
not) and, for each supported site, one check on the tiny model: patch moves the logits, unpatch gives
them back bit for bit; and the family's own scheme gives back the stock logits (within 1e-5 of their scale).

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/seq2seq_catalog.py [model_type ...]

writes benchmarks/results/seq2seq_catalog.json, the table seq2seq_support.md and hf_posenc/seq2seq_types.json
(what `hf-posenc list --model-types` prints after the causal types), and prints the support page's block (counts and
table; tests/test_seq2seq_zoo.py checks docs/support.md has it).
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
OUT = ROOT / "benchmarks" / "results" / "seq2seq_catalog.json"
TABLE = ROOT / "benchmarks" / "results" / "seq2seq_support.md"
SHIPPED = ROOT / "hf_posenc" / "seq2seq_types.json"

import torch  # noqa: E402
import transformers  # noqa: E402
import zoo  # noqa: E402
from tqdm import tqdm  # noqa: E402
from transformers.models.auto import modeling_auto  # noqa: E402

import hf_posenc as hp  # noqa: E402
from hf_posenc import seq2seq  # noqa: E402
from hf_posenc.catalog import why_not  # noqa: E402

# site -> the scheme that stands for it (as in the causal zoo)
# (a theta of its own, so that rope moves a model that rotates natively)
SITE_SCHEMES = {"input": ("learned", {"init": "normal"}), "qk": ("rope", {"theta": 500.0}), "score": ("alibi", {}),
                "none": ("nope", {})}
AUTO = {**{t: transformers.AutoModelForSeq2SeqLM for t in modeling_auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES},
        **{t: transformers.AutoModelForSpeechSeq2Seq for t in modeling_auto.MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES}}


def build(model_type: str) -> torch.nn.Module:
    """sdpa, else eager for the types that have no sdpa path (FSMT, BigBird-Pegasus)."""
    torch.manual_seed(0)
    try:
        return AUTO[model_type].from_config(zoo.tiny_config(model_type), attn_implementation="sdpa").eval()
    except ValueError as exc:
        if "does not support an attention implementation" not in str(exc):
            raise
    torch.manual_seed(0)
    return AUTO[model_type].from_config(zoo.tiny_config(model_type), attn_implementation="eager").eval()


def inputs(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Text ids, or the features a speech encoder reads (shaped by its main input name and config)."""
    g = torch.Generator().manual_seed(1)
    dec = {"decoder_input_ids": torch.randint(3, 120, (2, 6), generator=g)}
    if model.main_input_name == "input_ids":
        return {"input_ids": torch.randint(3, 120, (2, 10), generator=g), **dec}
    config = model.config
    bins = getattr(config, "num_mel_bins", None) or getattr(config, "input_feat_per_channel", 8)
    frames = 2 * (getattr(config, "max_source_positions", None) or 16)
    if model.main_input_name == "input_features" and config.model_type == "whisper":
        return {"input_features": torch.randn(2, bins, frames, generator=g), **dec}
    if model.main_input_name == "input_features":
        return {"input_features": torch.randn(2, frames, bins, generator=g), **dec}
    return {model.main_input_name: torch.randn(2, 1600, generator=g), **dec}


def logits(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return model(**batch).logits


def check_site(model_type: str, site: str, batch: dict[str, torch.Tensor]) -> str:
    scheme, options = SITE_SCHEMES[site]
    model = build(model_type)
    stock = logits(model, batch)
    hp.patch(model, scheme, **options)
    moved = float((logits(model, batch) - stock).abs().max())
    hp.unpatch(model)
    if not torch.equal(logits(model, batch), stock):
        return "fail: unpatch is not bit-exact"
    return "pass" if moved > 1e-3 else f"fail: {scheme} changed nothing"


def check_native(model_type: str, native: str, batch: dict[str, torch.Tensor]) -> str:
    model = build(model_type)
    stock = logits(model, batch)
    hp.patch(model, native)
    diff = float((logits(model, batch) - stock).abs().max())
    return "pass" if diff <= 1e-5 * float(stock.abs().max()) else f"fail: {native} differs from stock by {diff:.2e}"


def verdict(model: torch.nn.Module) -> tuple[list[str], dict[str, str | None]]:
    """The stacks a patch takes (those that read text) and, per site, why not (None: supported)."""
    return list(seq2seq.text_stacks(model)), {
        site: why_not(model, scheme) for site, (scheme, _) in SITE_SCHEMES.items()}


def entry(model_type: str) -> dict[str, Any]:
    row: dict[str, Any] = {"stacks": [], "native": "", "sites": {}, "why": "", "cells": {}}
    try:
        model = build(model_type)
        batch = inputs(model)
        logits(model, batch)
    except Exception as exc:  # noqa: BLE001 - the catalog records why a type does not build tiny
        return {**row, "status": "no-build", "why": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
    row["stacks"], why = verdict(model)
    row["sites"] = {site: reason is None for site, reason in why.items()}
    try:
        row["native"] = seq2seq.stack_adapter(model, (row["stacks"] or ["decoder"])[-1]).native
    except hp.PosEncError as exc:
        row["native"] = ""
        why.setdefault("all", str(exc))
    for site, ok in row["sites"].items():
        if ok:
            try:
                row["cells"][site] = check_site(model_type, site, batch)
            except Exception as exc:  # noqa: BLE001
                row["cells"][site] = f"fail: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    if row["native"] and why_not(model, row["native"]) is None:
        try:
            row["cells"]["native"] = check_native(model_type, row["native"], batch)
        except Exception as exc:  # noqa: BLE001
            row["cells"]["native"] = f"fail: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    failed = [f"{c}: {o}" for c, o in row["cells"].items() if o.startswith("fail")]
    reasons: dict[str, list[str]] = {}
    for site, reason in why.items():
        if reason is not None:
            reasons.setdefault(reason, []).append(site)
    row["why"] = "; ".join([*failed, *(f"{'/'.join(s)}: {r}" for r, s in reasons.items())]).replace("|", "/")
    sites = row["sites"].values()
    row["status"] = "fails" if failed else "full" if all(sites) else "partial" if any(sites) else "none"
    return row


def table(catalog: dict[str, dict[str, Any]]) -> str:
    lines = ["| model type | status | stacks | native | input | q/k | score | none | why not |",
             "|---|---|---|---|---|---|---|---|---|"]
    for model_type, row in catalog.items():
        marks = " | ".join("yes" if row["sites"].get(s) else "no" for s in SITE_SCHEMES)
        lines.append(f"| {model_type} | {row['status']} | {'+'.join(row['stacks'])} | {row['native']} | {marks} | "
                     f"{row['why'] if row['status'] != 'full' else ''} |")
    return "\n".join(lines) + "\n"


def counts(catalog: dict[str, dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for row in catalog.values():
        out[row["status"]] = out.get(row["status"], 0) + 1
    return dict(sorted(out.items()))


def shipped(catalog: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What hf_posenc/seq2seq_types.json holds."""
    return {"transformers": transformers.__version__, "types": {
        t: {k: row[k] for k in ("status", "stacks", "native", "sites", "why")} for t, row in catalog.items()}}


def readme_block(catalog: dict[str, dict[str, Any]]) -> str:
    found = ", ".join(f"{n} {s}" for s, n in counts(catalog).items())
    return (f"Of the {len(catalog)} encoder–decoder model types (seq-to-seq and speech seq-to-seq LMs), the seq2seq "
            f"sweep finds: {found} (*no-build*: the causal zoo's generic shrink does not build them tiny; *none*: "
            f"no text stack discovery can place, each named).\n\n{table(catalog)}")


def main() -> None:
    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    types = [a for a in sys.argv[1:] if not a.startswith("-")] or sorted(AUTO)
    catalog = json.loads(OUT.read_text()) if OUT.exists() and sys.argv[1:] else {}
    start = time.perf_counter()
    for model_type in tqdm(types, desc="seq2seq types"):
        catalog[model_type] = entry(model_type)
        tqdm.write(f"{model_type:24s} {catalog[model_type]['status']:8s} {catalog[model_type]['why'][:150]}")
    catalog = dict(sorted(catalog.items()))
    OUT.write_text(json.dumps(catalog, indent=1) + "\n")
    TABLE.write_text(table(catalog))
    SHIPPED.write_text(json.dumps(shipped(catalog), indent=1) + "\n")
    print(readme_block(catalog))
    print(json.dumps(counts(catalog)), f"{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
