"""vLLM models of patched folders: vLLM's own classes with the positions of `config.posenc` swapped in.

Each class subclasses vLLM's model of the stock architecture and builds it unchanged, then replaces what
computes positions, with vLLM's layers: the rotary module of every attention layer (vLLM's `get_rope` on the
rotated pairs, or none) and the ALiBi slopes of its attention kernel, which vLLM's attention backends take
per head (as vLLM's BLOOM and MPT pass them); a per-layer patch swaps them in its layers only. GPT-2 has no rotary module in vLLM, so its forward is written
here from the same blocks, without the learned table. What vLLM cannot compute was refused by
`served_positions` before anything was built. Imported by vLLM only (`hf_posenc.serving.vllm_plugin`).
"""

from __future__ import annotations

import re
from itertools import islice
from typing import Any

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.distributed import get_pp_group, get_tensor_model_parallel_rank
from vllm.model_executor.layers.rotary_embedding import get_rope
from vllm.model_executor.models.gpt2 import GPT2LMHeadModel
from vllm.model_executor.models.llama import LlamaForCausalLM
from vllm.model_executor.models.mistral import MistralForCausalLM
from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM
from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM

from ..errors import PosEncError
from .positions import ServedPositions, served_positions

__all__ = ["PosEncGPT2LMHeadModel", "PosEncLlamaForCausalLM", "PosEncMistralForCausalLM", "PosEncQwen2ForCausalLM",
           "PosEncQwen3ForCausalLM"]


class NoRotation(nn.Module):
    """vLLM's rotary call contract `(positions, q, k) -> (q, k)`, rotating nothing (NoPE, ALiBi)."""

    def forward(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        return query, key


class PairRotation(nn.Module):
    """hf-posenc's rotation with vLLM's rotary module: the pairs (i, i + D/2), i < `rotated_pairs`, of each
    head rotate by `get_rope` over those 2p dimensions (rotate-half layout, as vLLM's neox style); the other
    dimensions are scaled by `rest_scale`. With every pair rotated this is `get_rope` itself."""

    def __init__(self, served: ServedPositions, max_position: int) -> None:
        super().__init__()
        half, pairs = served.head_dim // 2, served.rotated_pairs
        self.head_dim, self.rest_scale = served.head_dim, served.rest_scale
        self.rope = get_rope(2 * pairs, max_position=max_position, is_neox_style=True,
                             rope_parameters=served.rope_parameters)
        rotated = torch.cat((torch.arange(pairs), torch.arange(half, half + pairs)))
        rest = torch.cat((torch.arange(pairs, half), torch.arange(half + pairs, served.head_dim)))
        self.register_buffer("rotated", rotated, persistent=False)
        self.register_buffer("rest", rest, persistent=False)

    def forward(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        if not len(self.rest):
            return self.rope(positions, query, key)
        q, k = (x.view(x.shape[0], -1, self.head_dim) for x in (query, key))
        q_rot, k_rot = (x[..., self.rotated].flatten(1) for x in (q, k))
        q_rot, k_rot = self.rope(positions, q_rot, k_rot)
        out = []
        for x, x_rot in ((q, q_rot), (k, k_rot)):
            y = torch.empty_like(x)
            y[..., self.rotated] = x_rot.view(x.shape[0], x.shape[1], -1)
            y[..., self.rest] = x[..., self.rest] * self.rest_scale
            out.append(y.flatten(1))
        return out[0], out[1]


def rotation(served: ServedPositions, vllm_config: VllmConfig) -> nn.Module:
    """The rotary module of every attention layer of a served model."""
    if served.rope_parameters is None:
        return NoRotation()
    config = vllm_config.model_config
    return PairRotation(served, max(config.max_model_len, config.hf_config.max_position_embeddings))


def give_alibi_slopes(attention: nn.Module, served: ServedPositions, heads: int) -> None:
    """Hand this rank's heads' ALiBi slopes to a built vLLM `Attention` layer's kernel, in the form the
    backends store what their constructor's `alibi_slopes` gives them (a float32 tensor)."""
    impl = attention.impl
    if not hasattr(impl, "alibi_slopes"):
        raise PosEncError(f"vLLM's {type(impl).__name__} attention takes no ALiBi slopes: scheme 'alibi' cannot be "
                          "served on this backend; load the folder with transformers + hf-posenc")
    start = get_tensor_model_parallel_rank() * heads
    impl.alibi_slopes = torch.tensor(served.alibi_slopes[start:start + heads], dtype=torch.float32)


def swap_positions(model: nn.Module, plan: tuple[ServedPositions, ...], vllm_config: VllmConfig) -> None:
    """Replace the positions of the attention layers of a vLLM Llama-family model (each holds its `rotary_emb`
    and its vLLM `attn`) that each entry of `plan` names (all of them for a whole-model patch); the others keep
    the model's own rotation."""
    for served in plan:
        rotary = rotation(served, vllm_config)
        for name, module in model.named_modules():
            if not (hasattr(module, "rotary_emb") and hasattr(module, "attn")):
                continue
            if served.layers is not None and layer_index(name) not in served.layers:
                continue
            module.rotary_emb = rotary
            if served.alibi_slopes is not None:
                give_alibi_slopes(module.attn, served, module.num_heads)


def layer_index(name: str) -> int:
    """The decoder layer of an attention module from its name in the model (`model.layers.3.self_attn`)."""
    found = re.search(r"\blayers\.(\d+)\.", name)
    if found is None:
        raise PosEncError(f"cannot tell which layer {name!r} is: per-layer positions need `layers.<i>.` in its name")
    return int(found.group(1))


def rotary_family(base: type[nn.Module]) -> type[nn.Module]:
    """The served twin of a vLLM Llama-family class: refuses first, then builds the stock model and swaps."""

    def __init__(self: nn.Module, *, vllm_config: VllmConfig, prefix: str = "", **kwargs: Any) -> None:
        served = served_positions(vllm_config.model_config.hf_config)
        base.__init__(self, vllm_config=vllm_config, prefix=prefix, **kwargs)
        swap_positions(self, served, vllm_config)

    name = f"PosEnc{base.__name__}"
    return type(name, (base,), {"__init__": __init__, "__module__": __name__, "__qualname__": name,
                                "__doc__": f"vLLM's {base.__name__} with the positions of config.posenc."})


PosEncLlamaForCausalLM = rotary_family(LlamaForCausalLM)
PosEncMistralForCausalLM = rotary_family(MistralForCausalLM)
PosEncQwen2ForCausalLM = rotary_family(Qwen2ForCausalLM)
PosEncQwen3ForCausalLM = rotary_family(Qwen3ForCausalLM)


class PosEncGPT2LMHeadModel(GPT2LMHeadModel):
    """vLLM's GPT-2 without its learned table (hf-posenc saves none for another scheme), positions in each
    attention layer instead: rotated q/k or ALiBi slopes."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        served, = served_positions(vllm_config.model_config.hf_config)  # a whole-model patch (refused otherwise)
        if get_pp_group().world_size > 1:
            raise PosEncError("hf-posenc serves GPT-2 folders without pipeline parallelism; use "
                              "tensor_parallel_size instead")
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self.transformer.wpe = None
        self.rotary = rotation(served, vllm_config)
        if served.alibi_slopes is not None:
            for block in self.transformer.h:
                give_alibi_slopes(block.attn.attn, served, block.attn.num_heads)

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor, intermediate_tensors: Any = None,
                inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        """vLLM's GPT2Model.forward and GPT2Block.forward, with q and k rotated and no table added."""
        model = self.transformer
        hidden = model.embed_input_ids(input_ids) if inputs_embeds is None else inputs_embeds
        for block in islice(model.h, model.start_layer, model.end_layer):
            attention = block.attn
            qkv, _ = attention.c_attn(block.ln_1(hidden))
            q, k, v = qkv.chunk(chunks=3, dim=-1)
            q, k = self.rotary(positions, q, k)
            out, _ = attention.c_proj(attention.attn(q, k, v))
            hidden = hidden + out
            hidden = hidden + block.mlp(block.ln_2(hidden))
        return model.ln_f(hidden)
