"""Running a model for scores: final hidden states, fp32 logits for just the rows scored, greedy answers
from one forward pass, and which failures mean "this length does not fit" rather than a bug."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

import evaluate
import torch
import torch.nn.functional as F
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.models.auto.modeling_auto import (
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
)

from ..catalog import adapter_for
from ..errors import PosEncError
from ..progress import bar
from .processes import across_processes

METRICS_DIR = Path(__file__).parents[1] / "metrics"
# Rows of hidden states sent through the output head at once: bounds the fp32 logits to
# LOGIT_CHUNK x vocab (200 MB for a 49k vocabulary) whatever the context length.
LOGIT_CHUNK = 1024
# What "this model cannot run this length" looks like: a patch's declared limit (PosEncError), a length past
# the model's own learned position table (IndexError, raised by `check_table` before the forward), out of memory. Recorded as a skipped length so a
# sweep keeps its other results; any other error is a bug and propagates.
LENGTH_LIMITS = (PosEncError, IndexError, torch.OutOfMemoryError)


def _names(mapping: dict) -> set[str]:
    return {n for v in mapping.values() for n in ((v,) if isinstance(v, str) else v)}


CAUSAL_LM_CLASSES = _names(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
MASKED_LM_CLASSES = _names(MODEL_FOR_MASKED_LM_MAPPING_NAMES)
CLASSIFIER_CLASSES = _names(MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES)


@functools.lru_cache(maxsize=None)
def load_metric(name: str) -> evaluate.EvaluationModule:
    """One of the evaluate modules shipped in hf_posenc/metrics (they work offline)."""
    path = METRICS_DIR / name
    if not path.is_dir():
        known = sorted(p.name for p in METRICS_DIR.iterdir() if p.is_dir() and not p.name.startswith("_"))
        raise PosEncError(f"no metric {name!r}; hf_posenc ships {', '.join(known)}")
    return evaluate.load(str(path))


def device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def table_positions(model: torch.nn.Module) -> int | None:
    """How many positions the model's own learned table holds (GPT-2, OPT, BERT), or None: relative positions,
    a model no adapter places, or a patch's table (which refuses longer inputs itself)."""
    try:
        adapter = adapter_for(model)
    except PosEncError:
        return None
    slot = model.base_model.get_submodule(adapter.slot.path) if adapter.slot else None
    if not isinstance(slot, torch.nn.Embedding):
        return None
    return slot.num_embeddings - adapter.slot.offset(model.config)


def check_table(model: torch.nn.Module, length: int) -> None:
    """Refuse `length` tokens past the model's learned position table before the forward: on CUDA the lookup
    past its end is a device-side assert that ends the process, not the IndexError of a CPU run that
    `LENGTH_LIMITS` records as a skipped length; this raises that IndexError on every device."""
    limit = table_positions(model)
    if limit is not None and length > limit:
        raise IndexError(f"{length} tokens need positions 0..{length - 1}, but {type(model).__name__}'s learned "
                         f"position table has {limit} positions")


def check_lengths(lengths: Sequence[int], what: str = "length") -> list[int]:
    if not lengths:
        raise PosEncError(f"give at least one {what}")
    bad = [L for L in lengths if not isinstance(L, int) or isinstance(L, bool) or L <= 0]
    if bad:
        raise PosEncError(f"every {what} must be a positive integer number of tokens; got {bad}")
    return list(lengths)


def skipped(err: BaseException) -> dict[str, str]:
    why = " (the input is longer than the model's learned position table)" if isinstance(err, IndexError) else ""
    return {"skipped": f"{type(err).__name__}: {err}{why}".strip()[:500]}


def one_text(input_ids: torch.Tensor | Sequence[int]) -> torch.Tensor:
    """Token ids of one text as a 1-D long tensor."""
    ids = torch.as_tensor(input_ids).long()
    if ids.dim() != 1:
        raise PosEncError(f"input_ids must be 1-D token ids of one text, got shape {tuple(ids.shape)}; pass ids[0]")
    return ids


def text_token_ids(tokenizer: PreTrainedTokenizerBase, text: str, n_tokens: int | None = None) -> torch.Tensor:
    """The first `n_tokens` token ids of a text (all if None), tokenizing only as much of it as needed."""
    if n_tokens is None:
        return torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)
    chars = max(n_tokens * 8, 1000)  # English averages ~4 characters per BPE token
    while True:
        ids = tokenizer(text[:chars], add_special_tokens=False)["input_ids"]
        if len(ids) > n_tokens or chars >= len(text):
            return torch.tensor(ids[:n_tokens], dtype=torch.long)
        chars *= 2


def output_head(model: torch.nn.Module) -> torch.nn.Module:
    name = type(model).__name__
    if name in MASKED_LM_CLASSES or getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        raise PosEncError(f"{name} is not a causal LM; perplexity and passkey need one (AutoModelForCausalLM)")
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None:
        raise PosEncError(f"{name} has no output head; load it with AutoModelForCausalLM")
    return head


def head_inputs(model: torch.nn.Module, head: torch.nn.Module, input_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """The final hidden states (B, T, d) that the model feeds its output head.

    The head itself is then run on one position only: callers compute logits just for the rows
    they score, in chunks, so memory stays bounded at any context length (a full (T, vocab) fp32
    logits tensor is 3.2 GB at 16k tokens for a 49k vocabulary).
    """
    check_table(model, input_ids.shape[-1])
    captured: list[torch.Tensor] = []

    def keep_input(module: torch.nn.Module, args: tuple) -> tuple:
        captured.append(args[0])
        return (args[0][..., -1:, :], *args[1:])

    handle = head.register_forward_pre_hook(keep_input)
    try:
        with torch.no_grad():
            model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    finally:
        handle.remove()
    if not captured:
        raise PosEncError(f"{type(model).__name__} never called its output head {type(head).__name__}")
    return captured[-1]


def logits(head: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """fp32 logits for rows of hidden states (bf16-safe: the softmax is never taken in half precision)."""
    with torch.no_grad():
        return head(hidden).float()


def token_nll(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-token negative log-likelihood (float64, CPU) of `targets` after rows of hidden states. The
    targets follow the logits to the head's device (a model spread by device_map="auto"); float64 only on the
    CPU (MPS has none)."""
    scores = logits(head, hidden)
    return F.cross_entropy(scores, targets.to(scores.device), reduction="none").cpu().double()


def require_pad(tokenizer: PreTrainedTokenizerBase) -> None:
    if tokenizer.pad_token_id is None:
        raise PosEncError(
            "the tokenizer has no pad token, needed to batch inputs of different lengths; set one first, e.g. "
            "`tokenizer.pad_token = tokenizer.eos_token`, or use batch_size=1"
        )


def padded_hidden(model: PreTrainedModel, head: torch.nn.Module, rows: Sequence[Sequence[int]],
                  pad_id: int | None) -> torch.Tensor:
    """Final hidden states of token rows of different lengths, right-padded (every real token keeps
    its own position, so no position ids are needed); a single row is run without a mask."""
    if len(rows) == 1:
        return head_inputs(model, head, torch.tensor([list(rows[0])], device=device(model)))
    ids = torch.full((len(rows), max(map(len, rows))), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, row in enumerate(rows):
        ids[r, : len(row)] = torch.tensor(row)
        mask[r, : len(row)] = 1
    return head_inputs(model, head, ids.to(device(model)), mask.to(device(model)))


def greedy_answers(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str],
                   answers: Sequence[str], *, extra: int = 0, batch_size: int = 1,
                   desc: str = "", progress: bool = False, distributed: bool = False) -> list[str]:
    """What greedy decoding would answer, from one teacher-forced forward pass per prompt.

    The argmax at each answer position is taken given the true prefix: all of them equal the
    reference answer exactly when `generate(do_sample=False)` would produce it, so exact-match
    accuracy is that of greedy generation at the cost of one forward pass and no KV cache.
    `extra` more positions past the answer are decoded too (to catch e.g. a longer number).
    `distributed` splits the prompts over the processes (see `processes.across_processes`).
    """
    head = output_head(model)
    rows = []
    for prompt, answer in zip(prompts, answers):
        prompt_ids = tokenizer(prompt)["input_ids"]
        full_ids = tokenizer(prompt + answer)["input_ids"]
        if full_ids[: len(prompt_ids)] != prompt_ids or len(full_ids) == len(prompt_ids):
            raise PosEncError(
                f"the tokenizer does not split {answer!r} from the prompt cleanly (prompt tokens are not a prefix); "
                "use a tokenizer that does not add end-of-sequence tokens"
            )
        rows.append((full_ids, len(prompt_ids)))
    if batch_size > 1:
        require_pad(tokenizer)

    def decode(part: list[tuple[list[int], int]]) -> list[str]:
        order = sorted(range(len(part)), key=lambda i: len(part[i][0]))  # similar lengths share a batch
        out: dict[int, str] = {}
        for i in bar(range(0, len(order), batch_size), desc=desc, unit="batch", show=progress):
            idx = order[i : i + batch_size]
            hidden = padded_hidden(model, head, [part[j][0] for j in idx], tokenizer.pad_token_id)
            for r, j in enumerate(idx):
                full_ids, start = part[j]
                stop = min(len(full_ids), len(full_ids) - 1 + extra)  # hidden at p predicts token p + 1
                picked = logits(head, hidden[r, start - 1 : stop]).argmax(-1).tolist()
                out[j] = tokenizer.decode(picked, skip_special_tokens=True)
        return [out[j] for j in range(len(part))]

    return across_processes(rows, decode, distributed)
