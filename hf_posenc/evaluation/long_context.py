"""Long-context scores of an in-memory (patched) model: perplexity by length and passkey retrieval."""

from __future__ import annotations

import hashlib
import math
import random
import re
from collections.abc import Sequence
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..errors import PosEncError
from ..progress import bar
from ..stats import rate_fields
from .names import DEFAULT_MODE, PERPLEXITY_MODES, check_mode, default_target
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






def target_ends(n_tokens: int, longest: int, target: int, max_windows: int | None) -> list[int]:
    """Where the same-target windows end (exclusive): spread evenly over the text after the first
    `longest` tokens, at least `target` apart so no token is scored twice; all lengths share them."""
    room = n_tokens - longest
    if room < 0:
        return []
    fit = room // target + 1
    count = fit if max_windows is None else min(max_windows, fit)
    step = room // (count - 1) if count > 1 else 0
    return [longest + i * step for i in range(count)]


def tokens_needed(mode: str, lengths: Sequence[int], max_windows: int | None, stride: int | None) -> int | None:
    """How many tokens of a text a suite tokenizes for these settings (None: all of it)."""
    if max_windows is None:
        return None
    longest = max(lengths)
    # same_target spreads its windows over 8x the text they cover: "many places", not one passage
    return longest * (1 + 8 * max_windows) if mode == "same_target" else longest + max_windows * (stride or longest)


def perplexity_by_length(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    lengths: Sequence[int],
    stride: int | None = None,
    batch_size: int = 1,
    max_windows: int | None = None,
    *,
    mode: str = DEFAULT_MODE,
    target: int | None = None,
    longest: int | None = None,
    progress: bool = False,
    distributed: bool = False,
) -> dict[int, dict[str, Any]]:
    """Perplexity of one token stream at each context length, in one of `PERPLEXITY_MODES`.

    "same_target" (default): windows of L tokens end at the same places of the text for every L
    (`target_ends`), and only their last `target` tokens are scored, so each length scores the very
    same target tokens and only the context before them grows. "sliding": windows of `length` tokens
    start every `stride` tokens (default: `length`, i.e. disjoint chunks) from the start of the text;
    the first window scores all its tokens, each later one only the `stride` tokens no earlier window
    scored ("Perplexity of fixed-length models", transformers docs; Press et al. 2021). With stride ==
    length this equals the plain loss of `model(chunk, labels=chunk)` averaged over chunks.

    Args:
        model: a causal LM, patched or not; it is run under no_grad.
        input_ids: 1-D token ids of a long text (see `hf_posenc.data.long_text`).
        lengths: context lengths in tokens; each must be > 0.
        stride: "sliding" only: tokens between window starts, clipped to each length.
        batch_size: windows per forward pass.
        max_windows: score at most this many windows per length (bounds the cost).
        mode: "same_target" or "sliding".
        target: "same_target" only: tokens scored per window, < every length (default: half the shortest).
        longest: "same_target" only: the longest length the windows must leave room for (default:
            max(lengths)); pass the sweep's longest when calling once per length.
        progress: show a tqdm bar per length.
        distributed: split the windows over the processes of the torch.distributed group (every
            process calls this with the same arguments and gets the same result; see `processes`).
    Returns:
        {length: {"perplexity", "loss" (mean nats/token), "tokens", "windows", "mode", "targets" (a
        digest of the target ids scored: equal at every length in same_target mode), and "stride"
        (sliding) or "target" (same_target)}}, or {length: {"skipped": reason}} where the model cannot
        run that length (see `LENGTH_LIMITS`).
    """
    lengths = check_lengths(lengths)
    ids = one_text(input_ids)
    check_mode(mode, stride)
    if stride is not None and stride <= 0:
        raise PosEncError(f"stride must be a positive number of tokens, got {stride}")
    if batch_size <= 0 or (max_windows is not None and max_windows <= 0):
        raise PosEncError(f"batch_size and max_windows must be positive, got {batch_size} and {max_windows}")
    longest = max(lengths) if longest is None else longest
    if mode == "same_target":
        shortest = min([L for L in lengths if L >= 2] or [2])  # a 1-token length is skipped, not scored
        target = default_target([shortest]) if target is None else target
        if not 0 < target < shortest or longest < max(lengths):
            raise PosEncError(f"same_target mode scores the last `target` tokens of every window: target must be in "
                              f"1..{shortest - 1} (below the shortest length) and longest >= {max(lengths)}, "
                              f"got target={target}, longest={longest}")
    head = output_head(model)
    results: dict[int, dict[str, Any]] = {}
    for length in lengths:
        reason = _unscorable(length, ids.numel())
        windows, facts = WINDOWS[mode](ids.numel(), length, stride=stride, max_windows=max_windows, target=target,
                                       longest=longest)
        if reason or not windows:
            results[length] = reason or {"skipped": f"the text has {ids.numel()} tokens, fewer than the longest "
                                                    f"length {longest}; pass a longer text"}
            continue
        try:
            results[length] = {**_score_windows(model, head, ids, windows, batch_size, progress, distributed),
                               "mode": mode, **facts}
        except LENGTH_LIMITS as err:
            results[length] = skipped(err)
    return results


def _same_target_windows(n_tokens: int, length: int, *, target: int, longest: int, max_windows: int | None,
                         **_: Any) -> tuple[list[tuple[int, int, int]], dict[str, Any]]:
    ends = target_ends(n_tokens, longest, target, max_windows)
    return [(end - length, end, target) for end in ends], {"target": target}


def _sliding_windows(n_tokens: int, length: int, *, stride: int | None, max_windows: int | None,
                     **_: Any) -> tuple[list[tuple[int, int, int]], dict[str, Any]]:
    step = min(stride or length, length)
    # the first window scores all its tokens, each later one the `step` tokens no earlier window scored
    starts = list(range(0, n_tokens - length + 1, step))[:max_windows]
    return [(s, s + length, length - 1 if s == 0 else min(step, length - 1)) for s in starts], {"stride": step}


# (start, end, tokens scored at the end) of every window at one length, and the facts the cell records
WINDOWS = {"same_target": _same_target_windows, "sliding": _sliding_windows}


def _unscorable(length: int, n_tokens: int) -> dict[str, str] | None:
    if length < 2:
        return {"skipped": "a 1-token window has nothing to predict; use lengths >= 2"}
    if n_tokens < length:
        return {"skipped": f"the text has {n_tokens} tokens, fewer than {length}; pass a longer text"}
    return None


def _chunks(first: int, end: int) -> list[tuple[int, int]]:
    """[first, end) in pieces of LOGIT_CHUNK target positions."""
    return [(lo, min(lo + LOGIT_CHUNK, end)) for lo in range(first, end, LOGIT_CHUNK)]


def _score_windows(model: PreTrainedModel, head: torch.nn.Module, ids: torch.Tensor,
                   windows: list[tuple[int, int, int]], batch_size: int, progress: bool,
                   distributed: bool) -> dict[str, Any]:
    """Pooled perplexity of windows (start, end, scored): ids[start:end] runs, its last `scored` tokens count."""
    length = windows[0][1] - windows[0][0]

    def score(batch_windows: list[tuple[int, int, int]]) -> list[tuple[float, int, list[int]]]:
        """(summed nll, tokens scored, target ids) of each window."""
        scored = []
        shown = bar(total=len(batch_windows), desc=f"perplexity @ {length}", unit="window", show=progress)
        for i in range(0, len(batch_windows), batch_size):
            batch = batch_windows[i : i + batch_size]
            rows = torch.stack([ids[start:end] for start, end, _ in batch]).to(device(model))
            hidden = head_inputs(model, head, rows)
            for row, (_, _, count) in enumerate(batch):
                first = length - count
                nll = torch.cat([token_nll(head, hidden[row, lo - 1 : hi - 1], rows[row, lo:hi])
                                 for lo, hi in _chunks(first, length)])
                scored.append((nll.sum().item(), count, rows[row, first:].tolist()))
            shown.update(len(batch))
        shown.close()
        return scored

    scored = across_processes(windows, score, distributed)
    # summed in window order, whichever process scored which window
    nll, count = math.fsum(n for n, _, _ in scored), sum(c for _, c, _ in scored)
    targets = hashlib.sha1(str([t for _, _, t in scored]).encode()).hexdigest()[:16]
    loss = nll / count
    return {"perplexity": math.exp(loss), "loss": loss, "tokens": count, "windows": len(windows), "targets": targets}


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
            for lo, hi in bar(_chunks(1, longest), desc=f"prefix perplexity @ {longest}", show=progress)
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
    trials: int = 4,
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
        trials: prompts (random keys in 1..50000, as in Landmark Attention) per length and depth; the
            default 4 x 5 depths gives 20 per length, enough for a 95% interval narrower than +-0.22.
        seed: seeds the keys.
        distributed: split the prompts over the processes (see `perplexity_by_length`).
    Returns:
        {length: {"accuracy", "by_depth": {depth: accuracy}, "trials", "tokens" (mean prompt length),
        "n", "low", "high" (the accuracy's 95% Wilson interval over n = trials x depths prompts)}}
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
        results[length] = {**cell, **rate_fields(round(cell["accuracy"] * cell["trials"]), cell["trials"])}
    return results
