"""PoSE position ids: train short windows on positions that cover a longer target length.

Zhu et al. 2024, "PoSE: Efficient Context Window Extension of LLMs via Positional Skip-wise Training",
Sec. 3.2: a window of L_c tokens is split into N chunks of random lengths l_0..l_{N-1}; chunk i keeps
its tokens contiguous and its positions are shifted by a skip bias u_i, drawn with
u_0 = 0 <= u_1 <= ... <= u_{N-1} <= L_t - L_c, so every position id is below the target length L_t
and the relative distances of a long context are all seen. Ids are drawn per row, from a generator
seeded by (seed, the row's tokens): the same run gives the same ids on 1 process or N and after a resume.
"""

from __future__ import annotations

import zlib
from typing import Any

import torch


def pose_position_ids(length: int, target_length: int, chunks: int, generator: torch.Generator) -> torch.Tensor:
    """Position ids (1-D, `length` long) of one PoSE window: `chunks` contiguous runs, the first from 0,
    each later one after a skip, all ids < `target_length`.

    Args:
        length: tokens in the window (L_c); must be <= target_length.
        target_length: the context length the positions cover (L_t).
        chunks: N; fewer when the window is shorter than N tokens.
        generator: the source of randomness (chunk lengths and skips).
    """
    n = max(1, min(chunks, length))
    # chunk lengths: n - 1 distinct cut points in 1..length-1, so every chunk has at least one token
    cuts = (torch.randperm(length - 1, generator=generator)[: n - 1] + 1).sort().values.tolist()
    starts = [0, *cuts]
    lengths = [b - a for a, b in zip(starts, [*cuts, length])]
    # skip biases as in the paper: u_0 = 0, u_i ~ U{u_{i-1}, ..., L_t - L_c}
    room, skips = target_length - length, [0]
    for _ in range(n - 1):
        skips.append(int(torch.randint(skips[-1], room + 1, (), generator=generator)))
    return torch.cat([torch.arange(s + u, s + u + m) for s, u, m in zip(starts, skips, lengths)])


def document_spans(input_ids: torch.Tensor, eos_id: int | None) -> list[tuple[int, int]]:
    """(start, end) of each document of a packed row: a document ends after its EOS token."""
    length = input_ids.numel()
    if eos_id is None:
        return [(0, length)]
    ends = [i + 1 for i in (input_ids == eos_id).nonzero().flatten().tolist() if i + 1 < length] + [length]
    return list(zip([0, *ends[:-1]], ends))


def block_causal_mask(spans: list[tuple[int, int]], length: int, dtype: torch.dtype) -> torch.Tensor:
    """An additive (1, L, L) mask in the model's `dtype` (sdpa's fused kernels take no float mask of another dtype
    than q): causal inside each document, nothing across documents."""
    allowed = torch.zeros(length, length, dtype=torch.bool)
    for a, b in spans:
        allowed[a:b, a:b] = True
    allowed &= torch.ones(length, length, dtype=torch.bool).tril()
    mask = torch.zeros(length, length, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    return mask[None]


class PoseCollator:
    """Training batches of packed LM blocks (TRL's rows) with PoSE `position_ids`; each document of a row gets its
    own ids from 0, drawn from a generator seeded by (seed, the row's tokens), so a row gets the same ids on 1
    process or N and after a resume.

    A row of one document gets a 2-D all-ones `attention_mask` (transformers reads position ids that
    do not step by +1 without a mask as packed sequences, which would cut attention at every skip); a
    row of several gets a block-causal 4-D float mask, so packed documents stay apart as their
    restarting ids say. Rows of a batch must then agree: every mask is 4-D when any is.
    Float masks are in `dtype`, the model's.
    """

    def __init__(self, target_length: int, chunks: int, seed: int, eos_id: int | None,
                 dtype: torch.dtype = torch.float32) -> None:
        self.target_length, self.chunks, self.seed, self.eos_id = target_length, chunks, seed, eos_id
        self.dtype = dtype

    def row(self, ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """One block's position ids and mask."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + zlib.crc32(ids.numpy().tobytes()))
        spans = document_spans(ids, self.eos_id)
        position_ids = torch.cat([pose_position_ids(b - a, self.target_length, self.chunks, g) for a, b in spans])
        mask = (torch.ones(ids.numel(), dtype=torch.long) if len(spans) == 1
                else block_causal_mask(spans, ids.numel(), self.dtype))
        return {"position_ids": position_ids, "attention_mask": mask}

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        rows = []
        for example in examples:
            ids = torch.as_tensor(example["input_ids"], dtype=torch.long)
            labels = torch.as_tensor(example.get("labels", example["input_ids"]), dtype=torch.long)
            rows.append({"input_ids": ids, "labels": labels, **self.row(ids)})
        if len({r["attention_mask"].ndim for r in rows}) > 1:  # a 2-D mask joins as a 4-D causal one
            rows = [{**r, "attention_mask": block_causal_mask([(0, r["input_ids"].numel())], r["input_ids"].numel(),
                                                              self.dtype)} if r["attention_mask"].ndim == 1 else r
                    for r in rows]
        return {k: torch.stack([r[k] for r in rows]) for k in rows[0]}
