"""Long-context scores of an in-memory (patched) model: perplexity by length and passkey retrieval."""

from __future__ import annotations

import math
import random
import re
from collections.abc import Sequence
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..errors import PosEncError
from .processes import across_processes
from .scoring import (
    LENGTH_LIMITS,
    LOGIT_CHUNK,
    check_lengths,
    device,
    greedy_answers,
    head_inputs,
    load_metric,
    one_text,
    output_head,
    skipped,
    token_nll,
)

# The passkey prompt of Mohtashami & Jaggi 2023 (Landmark Attention, run_test.py), also used by
# Chen et al. 2023 (Position Interpolation): task, filler, needle at a depth, filler, question.
PASSKEY_TASK = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
    "I will quiz you about the important information there."
)
PASSKEY_FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
PASSKEY_NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key."
PASSKEY_QUESTION = "What is the pass key? The pass key is"


def perplexity_by_length(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    lengths: Sequence[int],
    stride: int | None = None,
    batch_size: int = 1,
    max_windows: int | None = None,
    *,
    progress: bool = False,
    distributed: bool = False,
) -> dict[int, dict[str, Any]]:
    """Sliding-window perplexity of one token stream at each context length.

    Windows of `length` tokens start every `stride` tokens (default: `length`, i.e. disjoint
    chunks). The first window scores all its tokens; each later one scores only the `stride`
    tokens no earlier window scored, with the rest as context ("Perplexity of fixed-length
    models", transformers docs; Press et al. 2021, sliding-window evaluation). With stride ==
    length this equals the plain loss of `model(chunk, labels=chunk)` averaged over chunks.

    Args:
        model: a causal LM, patched or not; it is run under no_grad.
        input_ids: 1-D token ids of a long text (see `hf_posenc.data.long_text`).
        lengths: context lengths in tokens; each must be > 0.
        stride: tokens between window starts, clipped to each length.
        batch_size: windows per forward pass.
        max_windows: score at most this many windows per length (bounds the cost).
        progress: show a tqdm bar per length.
        distributed: split the windows over the processes of the torch.distributed group (every
            process calls this with the same arguments and gets the same result; see `processes`).
    Returns:
        {length: {"perplexity", "loss" (mean nats/token), "tokens", "windows", "stride"}}, or
        {length: {"skipped": reason}} where the model cannot run that length (see `LENGTH_LIMITS`).
    """
    lengths = check_lengths(lengths)
    ids = one_text(input_ids)
    if stride is not None and stride <= 0:
        raise PosEncError(f"stride must be a positive number of tokens, got {stride}")
    if batch_size <= 0 or (max_windows is not None and max_windows <= 0):
        raise PosEncError(f"batch_size and max_windows must be positive, got {batch_size} and {max_windows}")
    head = output_head(model)
    results: dict[int, dict[str, Any]] = {}
    for length in lengths:
        reason = _unscorable(length, ids.numel())
        if reason:
            results[length] = reason
            continue
        try:
            results[length] = _perplexity_at(model, head, ids, length, min(stride or length, length),
                                             batch_size, max_windows, progress, distributed)
        except LENGTH_LIMITS as err:
            results[length] = skipped(err)
    return results


def _unscorable(length: int, n_tokens: int) -> dict[str, str] | None:
    if length < 2:
        return {"skipped": "a 1-token window has nothing to predict; use lengths >= 2"}
    if n_tokens < length:
        return {"skipped": f"the text has {n_tokens} tokens, fewer than {length}; pass a longer text"}
    return None


def _chunks(first: int, end: int) -> list[tuple[int, int]]:
    """[first, end) in pieces of LOGIT_CHUNK target positions."""
    return [(lo, min(lo + LOGIT_CHUNK, end)) for lo in range(first, end, LOGIT_CHUNK)]


def _perplexity_at(model: PreTrainedModel, head: torch.nn.Module, ids: torch.Tensor, length: int, stride: int,
                   batch_size: int, max_windows: int | None, progress: bool, distributed: bool) -> dict[str, Any]:
    starts = list(range(0, ids.numel() - length + 1, stride))[:max_windows]

    def score(batch_starts: list[int]) -> list[tuple[float, int]]:
        """(summed nll, tokens scored) of each window."""
        scored = []
        bar = tqdm(total=len(batch_starts), desc=f"perplexity @ {length}", unit="window", disable=None if progress else True)
        for i in range(0, len(batch_starts), batch_size):
            batch = batch_starts[i : i + batch_size]
            windows = torch.stack([ids[s : s + length] for s in batch]).to(device(model))
            hidden = head_inputs(model, head, windows)
            for row, start in enumerate(batch):
                # targets at window positions [first, length): tokens no earlier window scored
                first = 1 if start == 0 else max(1, length - stride)
                nll = torch.cat([token_nll(head, hidden[row, lo - 1 : hi - 1], windows[row, lo:hi])
                                 for lo, hi in _chunks(first, length)])
                scored.append((nll.sum().item(), length - first))
            bar.update(len(batch))
        bar.close()
        return scored

    windows = across_processes(starts, score, distributed)
    # summed in window order, whichever process scored which window
    nll, count = math.fsum(n for n, _ in windows), sum(c for _, c in windows)
    loss = nll / count
    return {"perplexity": math.exp(loss), "loss": loss, "tokens": count, "windows": len(starts), "stride": stride}


def prefix_perplexity(
    model: PreTrainedModel, input_ids: torch.Tensor, lengths: Sequence[int], *, progress: bool = False
) -> dict[int, dict[str, Any]]:
    """Perplexity of the first `length` tokens for every length, from one forward pass of the longest.

    In a causal model the logits at position t do not depend on later tokens, so this equals
    `perplexity_by_length(model, ids, [length], max_windows=1)` for each length at the cost of the
    longest alone -- provided positions are static (learned, RoPE and its linear/NTK/YaRN scalings,
    ALiBi). It does not hold for `dynamic` scaling, whose frequencies depend on the total length.
    If the longest length does not fit, every length is recorded as skipped.
    """
    lengths = sorted(check_lengths(lengths))
    ids = one_text(input_ids)
    head = output_head(model)
    reasons = {L: _unscorable(L, ids.numel()) for L in lengths}
    results = {L: reason for L, reason in reasons.items() if reason}
    fitting = [L for L in lengths if L not in results]
    if not fitting:
        return results
    longest = fitting[-1]
    window = ids[None, :longest].to(device(model))
    try:
        hidden = head_inputs(model, head, window)[0]
        nll = torch.cat([
            token_nll(head, hidden[lo - 1 : hi - 1], window[0, lo:hi])
            for lo, hi in tqdm(_chunks(1, longest), desc=f"prefix perplexity @ {longest}", disable=None if progress else True)
        ]).cumsum(0)
    except LENGTH_LIMITS as err:
        return {**results, **{L: skipped(err) for L in fitting}}
    for L in fitting:
        loss = (nll[L - 2] / (L - 1)).item()
        results[L] = {"perplexity": math.exp(loss), "loss": loss, "tokens": L - 1, "windows": 1, "stride": L}
    return dict(sorted(results.items()))


def passkey_prompt(tokenizer: PreTrainedTokenizerBase, length: int, depth: float, key: int) -> str:
    """The passkey prompt of about `length` tokens (never more, answer included), needle at `depth`."""
    if not 0.0 <= depth <= 1.0:
        raise PosEncError(f"depth must be in [0, 1] (0 = needle first, 1 = needle last), got {depth}")

    def build(n_filler: int) -> str:
        before = round(depth * n_filler)
        lines = [PASSKEY_TASK, " ".join([PASSKEY_FILLER] * before), PASSKEY_NEEDLE.format(key=key),
                 " ".join([PASSKEY_FILLER] * (n_filler - before)), PASSKEY_QUESTION]
        return "\n".join(lines)

    def size(n_filler: int) -> int:
        return len(tokenizer(build(n_filler) + f" {key}")["input_ids"])

    per_filler = max(1.0, (size(11) - size(1)) / 10)
    n_filler = max(0, int((length - size(0)) / per_filler))
    while n_filler > 0 and size(n_filler) > length:
        n_filler -= 1
    if size(n_filler) > length:
        raise PosEncError(f"length {length} is too short for the passkey prompt, which needs {size(0)} tokens")
    return build(n_filler)


def passkey(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    lengths: Sequence[int],
    depths: Sequence[float] = (0.0, 0.25, 0.5, 0.75, 1.0),
    trials: int = 2,
    *,
    seed: int = 0,
    progress: bool = False,
    distributed: bool = False,
) -> dict[int, dict[str, Any]]:
    """Passkey retrieval accuracy by context length x needle depth.

    Args:
        model: a causal LM; tokenizer: its tokenizer.
        lengths: prompt lengths in tokens (each prompt fills its length as closely as whole
            filler sentences allow).
        depths: needle positions in [0, 1].
        trials: prompts (random keys in 1..50000, as in Landmark Attention) per length and depth.
        seed: seeds the keys.
        distributed: split the prompts over the processes (see `perplexity_by_length`).
    Returns:
        {length: {"accuracy", "by_depth": {depth: accuracy}, "trials", "tokens" (mean prompt length)}}
        or {length: {"skipped": reason}}.
    """
    lengths = check_lengths(lengths)
    if trials <= 0 or not depths or not all(0.0 <= d <= 1.0 for d in depths):
        raise PosEncError(f"need trials > 0 and depths in [0, 1] (0 = needle first, 1 = last), "
                          f"got trials={trials}, depths={list(depths)}")
    output_head(model)
    rng = random.Random(seed)
    metric = load_metric("passkey")
    results: dict[int, dict[str, Any]] = {}
    for length in lengths:
        keys = [str(rng.randint(1, 50000)) for _ in depths for _ in range(trials)]
        cells = [d for d in depths for _ in range(trials)]
        try:
            prompts = [passkey_prompt(tokenizer, length, d, int(k)) for d, k in zip(cells, keys)]
        except PosEncError as err:  # the length is too short for the prompt
            results[length] = {"skipped": str(err)}
            continue
        try:
            answers = greedy_answers(model, tokenizer, prompts, [f" {k}" for k in keys], extra=1,
                                     desc=f"passkey @ {length}", progress=progress, distributed=distributed)
        except LENGTH_LIMITS as err:
            results[length] = skipped(err)
            continue
        # the first number in the greedy continuation is the answer, as in Landmark Attention's scorer
        numbers = [(re.findall(r"\d+", a) or [""])[0] for a in answers]
        scored = metric.compute(predictions=numbers, references=keys, lengths=[length] * len(keys), depths=cells)
        cell = scored["by_length"][length]
        cell["tokens"] = sum(len(tokenizer(p)["input_ids"]) for p in prompts) / len(prompts)
        results[length] = cell
    return results
