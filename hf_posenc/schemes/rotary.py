"""The rotation every rotary scheme shares: `Rotary` gives (cos, sin) like transformers' rotary modules, `rotate`
applies them (rotate-half layout, pairs (i, i + d/2)). Its own module so that `base`, `rope` and the schemes built
on RoPE (xPos, Self-Extend, the scalings) all import it from below."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .. import compat


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, L, H, D) rotated by cos/sin (B, L, D) laid out as [c | c], [s | s]: pair (i, i + D/2)
    becomes (x_i c_i - x_{i+D/2} s_i, x_{i+D/2} c_i + x_i s_i); fp32 inside, cast back. Written on
    halves: one pass fewer than x*cos + rotate_half(x)*sin."""
    half = x.shape[-1] // 2
    xf = x.float()
    x1, x2 = xf[..., :half], xf[..., half:]
    c, s = cos[:, :, None, :half].float(), sin[:, :, None, :half].float()
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).to(x.dtype)


def rotate_heads(x: torch.Tensor, rotary: nn.Module, positions: torch.Tensor) -> torch.Tensor:
    """x (B, H, L, D) rotated to `positions` (B, L) by `rotary`, in fp32 (for schemes that rotate inside attention)."""
    cos, sin = rotary(torch.empty(0, device=x.device), positions)
    return rotate(x.transpose(1, 2).float(), cos, sin).transpose(1, 2)


def carry_attributes(module: nn.Module, replaces: nn.Module) -> None:
    """What model code reads off a model's own rotary module besides calling it (`compat.ROTARY_ATTRIBUTES`), set on
    `module`, which takes its place."""
    for name in compat.ROTARY_ATTRIBUTES:
        if hasattr(replaces, name):
            setattr(module, name, getattr(replaces, name))


class Rotary(nn.Module):
    """`forward(x, position_ids) -> (cos, sin)` over the full head dim, like transformers' rotary modules.

    The frequencies come from transformers' own rotary module and `ROPE_INIT_FUNCTIONS`, so every
    RoPE type (linear, dynamic, yarn, llama3, longrope) works on any model.
    """

    def __init__(self, head_dim: int, rope_parameters: dict[str, Any], partial: float, max_positions: int,
                 replaces: nn.Module | None = None) -> None:
        """`replaces`: the model's own rotary module this one takes the place of; what model code reads off it besides
        calling it (`compat.ROTARY_ATTRIBUTES`) is kept."""
        super().__init__()
        self.head_dim = head_dim
        if replaces is not None:
            carry_attributes(self, replaces)
        self.rotated_pairs = int(head_dim * partial) // 2
        self.inner = None
        if self.rotated_pairs:
            config = compat.rotary_config(
                head_dim=2 * self.rotated_pairs, max_position_embeddings=max_positions, rope_parameters=rope_parameters
            )
            self.inner = compat.rotary_module_class()(config)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor,
                layer_type: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """`layer_type` is taken (and ignored) where a model asks per layer type (Gemma 3): one rotation for all.
        Multimodal RoPE hands (3, B, L) ids; text positions are the same in all three."""
        position_ids = position_ids[0] if position_ids.dim() == 3 else position_ids
        shape = (*position_ids.shape, self.head_dim // 2 - self.rotated_pairs)
        scale = self.inner.attention_scaling if self.inner is not None else 1.0
        cos = torch.full(shape, scale, dtype=torch.float32, device=position_ids.device)
        sin = torch.zeros(shape, dtype=torch.float32, device=position_ids.device)
        if self.inner is not None:
            ref = torch.empty(0, dtype=torch.float32, device=position_ids.device)
            rot_cos, rot_sin = self.inner(ref, position_ids)
            cos = torch.cat((rot_cos[..., : self.rotated_pairs], cos), dim=-1)
            sin = torch.cat((rot_sin[..., : self.rotated_pairs], sin), dim=-1)
        return torch.cat((cos, cos), dim=-1).to(x.dtype), torch.cat((sin, sin), dim=-1).to(x.dtype)
