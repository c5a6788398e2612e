"""PoSE position ids: train short windows on positions that cover a longer target length.

Zhu et al. 2024, "PoSE: Efficient Context Window Extension of LLMs via Positional Skip-wise Training",
Sec. 3.2: a window of L_c tokens is split into N chunks of random lengths l_0..l_{N-1}; chunk i keeps
its tokens contiguous and its positions are shifted by a skip bias u_i, drawn with
u_0 = 0 <= u_1 <= ... <= u_{N-1} <= L_t - L_c, so every position id is below the target length L_t
and the relative distances of a long context are all seen. Ids are drawn per example, from a generator
seeded by (seed, example index): the same run gives the same ids on 1 process or N and after a resume.
"""

from __future__ import annotations

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


class PoseRows(torch.utils.data.Dataset):
    """Packed LM blocks with PoSE `position_ids`; each document of a row gets its own ids from 0.

    A row of one document gets a 2-D all-ones `attention_mask` (transformers reads position ids that
    do not step by +1 without a mask as packed sequences, which would cut attention at every skip); a
    row of several gets a block-causal 4-D float mask, so packed documents stay apart as their
    restarting ids say. Rows of a batch must then agree: `collate` pads every mask to 4-D when any is.
    Float masks are in `dtype`, the model's.
    """

    def __init__(self, rows: torch.utils.data.Dataset, target_length: int, chunks: int, seed: int, eos_id: int | None,
                 dtype: torch.dtype = torch.float32) -> None:
        self.rows, self.target_length, self.chunks, self.seed, self.eos_id = rows, target_length, chunks, seed, eos_id
        self.dtype = dtype

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        row = self.rows[i]
        ids = row["input_ids"]
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        spans = document_spans(ids, self.eos_id)
        position_ids = torch.cat([pose_position_ids(b - a, self.target_length, self.chunks, g) for a, b in spans])
        mask = (torch.ones(ids.numel(), dtype=torch.long) if len(spans) == 1
                else block_causal_mask(spans, ids.numel(), self.dtype))
        return {**row, "position_ids": position_ids, "attention_mask": mask}

    @staticmethod
    def collate(batch: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """Stack rows; 2-D masks become 4-D causal ones when another row of the batch has documents."""
        if len({b["attention_mask"].ndim for b in batch if "attention_mask" in b}) > 1:
            dtype = next(b["attention_mask"].dtype for b in batch if b["attention_mask"].ndim == 3)
            batch = [{**b, "attention_mask": block_causal_mask([(0, b["input_ids"].numel())], b["input_ids"].numel(),
                                                               dtype)}
                     if b["attention_mask"].ndim == 1 else b for b in batch]
        return {k: torch.stack([b[k] for b in batch]) for k in batch[0]}
