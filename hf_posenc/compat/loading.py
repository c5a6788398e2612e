"""transformers' loading: GGUF files unpacked dense, a checkpoint's keys renamed as transformers renames them, and
the load report transformers logs (held, then passed on without the patch's own keys)."""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, Collection, Iterator

import torch

def dense_gguf_kwargs(gguf_file: str) -> dict[str, Any]:
    """`from_pretrained` kwargs that unpack a GGUF file into plain dense weights.

    Left packed (or dequantized under the legacy loader, which keeps its quantizer), the model
    refuses `save_pretrained`; asked to dequantize, transformers drops the quantizer itself.
    """
    from transformers.utils.quantization_config import GgufConfig

    return {"gguf_file": gguf_file, "quantization_config": GgufConfig(gguf_file=gguf_file, dequantize=True)}



# What an Auto class adds to the kwargs it hands a remote-code class's `from_pretrained`: trust_remote_code, and
# since 5.25 `_from_auto`, which the Auto class the remote code then calls adds again ("got multiple values").
REMOTE_HANDOFF_KWARGS = ("trust_remote_code", "_from_auto")


def saves_here() -> bool:
    """Whether `save_pretrained` writes files in this process: from 5.25 on, only rank 0 of an initialised process
    group does (the other ranks' folders stay empty)."""
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    return not distributed or torch.distributed.get_rank() == 0


def without_handoff_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """`kwargs` without what an Auto class added when it handed the load to remote code."""
    return {k: v for k, v in kwargs.items() if k not in REMOTE_HANDOFF_KWARGS}


def checkpoint_key_renamer(model: torch.nn.Module, keys: Collection[str]) -> Callable[[str], str]:
    """A checkpoint file's key -> the model's own name among `keys`, as transformers 5's loading renames it: the
    model's renamings on save and load (Qwen2-Audio saves `language_model.model.*` for `model.language_model.*`),
    then the base model's prefix added or taken off, so that a checkpoint saved with a head loads into the base
    model and one saved from the base model into a model with a head."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightRenaming

    renames = [t for t in get_model_conversion_mapping(model) if isinstance(t, WeightRenaming)]
    prefix = f"{model.base_model_prefix}." if getattr(model, "base_model_prefix", "") else ""

    def rename(key: str) -> str:
        if key in keys:
            return key
        for transform in renames:
            key = transform.rename_source_key(key)[0]
        if prefix and key.startswith(prefix) and key[len(prefix):] in keys:
            return key[len(prefix):]
        if prefix and key not in keys and prefix + key in keys:
            return prefix + key
        return key

    return rename



LOAD_LOGGER = "transformers.modeling_utils"  # where transformers logs what a load left missing, unexpected or mismatched
# how transformers 5 heads that one warning: "<Class> LOAD REPORT from ..." (some earlier 5.x: "State-dict loading
# report for <Class> ...")
LOAD_REPORTS = ("load report", "loading report")


@contextlib.contextmanager
def load_report_held() -> Iterator[None]:
    """While a model loads, hold back transformers' load report and let every other message through; a load that
    fails logs it after all (the error points at it)."""
    logger = logging.getLogger(LOAD_LOGGER)
    held: list[logging.LogRecord] = []

    def hold(record: logging.LogRecord) -> bool:
        if any(words in record.getMessage().lower() for words in LOAD_REPORTS):
            held.append(record)
            return False
        return True

    logger.addFilter(hold)
    try:
        yield
    except BaseException:
        logger.removeFilter(hold)
        for record in held:
            logger.handle(record)
        raise
    finally:
        logger.removeFilter(hold)


def log_load_report(model: torch.nn.Module, source: str, info: dict[str, Any], note: str) -> None:
    """Log a load report from `from_pretrained(..., output_loading_info=True)`'s `info` where transformers logs its
    own (its verbosity decides), in its words; `note` says what was left out of it."""
    lines = [f"{type(model).__name__} LOAD REPORT from: {source} ({note})"]
    if info["missing_keys"]:
        lines.append(f"- MISSING, newly initialized: {', '.join(sorted(info['missing_keys']))}")
    if info["unexpected_keys"]:
        lines.append(f"- UNEXPECTED, not loaded: {', '.join(sorted(info['unexpected_keys']))}")
    for entry in sorted(info["mismatched_keys"], key=str):
        key, *shapes = entry if isinstance(entry, tuple) else (entry,)
        sizes = f" - ckpt: {tuple(shapes[0])} vs model: {tuple(shapes[1])}" if len(shapes) == 2 else ""
        lines.append(f"- MISMATCH: {key} (Reinit due to size mismatch{sizes})")
    if len(lines) > 1:
        logging.getLogger(LOAD_LOGGER).warning("\n".join(lines))
