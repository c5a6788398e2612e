"""What an engine must compute in place of a patched folder's stock positions, decided from its config alone.

An engine serves a folder with its own layers (vLLM's rotary kernels and attention), so it can express only
schemes those layers take: no rotation (`nope`), ALiBi slopes in the attention kernel (`alibi`), and RoPE
with other `rope_parameters` on some of each head's dimension pairs (`rope`, `yarn`). Every other scheme is
refused here, by name and in one line, before an engine builds anything: a learned bias or table, xPos's
decay and Self-Extend's grouped positions need attention code of their own; `dynamic` / `longrope` pick
their frequencies from the length of each input, which an engine batching many sequences does not see; and
`ntk`, `linear`, `llama3` would take `yarn`'s path but no test has served them yet.
No engine is imported here, so the decisions are tested where no engine is installed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..catalog import get_scheme, list_schemes
from ..errors import PosEncError
from ..writing import stock_architectures
from ..schemes.base import ModelFacts, RotaryScheme
from ..schemes.rotary import Rotary

__all__ = ["SERVED", "ServedPositions", "served_positions"]

# schemes an engine computes with its own layers (`Scheme.served`), each proven token for token
# (tests/test_serving.py); `ntk` and `linear` would take the same path as `rope` / `yarn` but are refused until a
# test serves them
SERVED = tuple(name for name in list_schemes() if get_scheme(name).served)
# the stock architectures whose served twins hf-posenc registers (hf_posenc.serving.vllm_plugin)
ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "GPT2LMHeadModel")
LAYERED_ARCHITECTURES = ARCHITECTURES[:4]  # per-layer patches: the rotating families, each layer its own rotary


@dataclass(frozen=True)
class ServedPositions:
    """The positions of one patched folder, as an engine's layers take them.

    `rope_parameters` (vLLM's and transformers' format) rotate the first `rotated_pairs` dimension pairs
    (i, i + head_dim/2) of each head, as hf-posenc's rotation does (`hf_posenc.schemes.rope`); the other
    dimensions are multiplied by `rest_scale` (the rotation's attention factor, as hf-posenc applies it to
    them). `alibi_slopes` are per head, for all heads. A scheme with neither computes no positions.
    """

    scheme: str
    head_dim: int
    rope_parameters: dict[str, Any] | None = None
    rotated_pairs: int = 0
    rest_scale: float = 1.0
    alibi_slopes: tuple[float, ...] | None = None
    layers: tuple[int, ...] | None = None  # the attention layers that take them (None: every layer)


def refusal(scheme: str, architecture: str) -> PosEncError:
    """The one-line refusal of a scheme an engine cannot express."""
    return PosEncError(
        f"hf-posenc cannot serve scheme {scheme!r} ({architecture}) on an inference engine: its attention "
        f"cannot express it; engines serve {', '.join(SERVED)} on {', '.join(ARCHITECTURES)}. This folder "
        "runs with transformers + hf-posenc: hf_posenc.from_pretrained(folder) or "
        "AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)")


def served_positions(config: Any) -> tuple[ServedPositions, ...]:
    """The positions of a patched folder's config (a transformers config with `posenc`, as an engine loads it):
    one per entry of a per-layer patch (the other layers keep the model's own rotation), one for every layer
    otherwise; or PosEncError naming the scheme when an engine cannot compute them."""
    posenc = getattr(config, "posenc", None)
    stock = (stock_architectures(config) or ["?"])[0]
    if not posenc:
        raise PosEncError(f"{stock}: the config has no posenc: not a folder hf-posenc patched; serve it as {stock}")
    entries = posenc["map"] if "map" in posenc else [posenc]
    if any(entry.get("layers") is not None for entry in entries) and stock not in LAYERED_ARCHITECTURES:
        raise PosEncError(f"hf-posenc serves per-layer patches on {', '.join(LAYERED_ARCHITECTURES)}, not {stock} "
                          "(its learned table stays for the other layers, which the served model drops); this "
                          "folder runs with transformers + hf-posenc: hf_posenc.from_pretrained(folder)")
    return tuple(entry_positions(entry["scheme"], entry.get("options") or {}, entry.get("layers"), config, stock)
                 for entry in entries)


def entry_positions(scheme: str, options: dict[str, Any], layers: list[int] | None, config: Any,
                    stock: str) -> ServedPositions:
    """The positions of one scheme (in `layers`, or every layer), or PosEncError naming it."""
    spec = get_scheme(scheme) if scheme in list_schemes() else None
    if spec is None or not spec.served or stock not in ARCHITECTURES:
        raise refusal(scheme, stock)
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    where = tuple(layers) if layers is not None else None
    if (slopes := spec.distance_slopes(options, heads)) is not None:
        return ServedPositions(scheme, head_dim, alibi_slopes=tuple(slopes.tolist()), layers=where)
    if not isinstance(spec, RotaryScheme):  # served, neither slopes nor a rotation: no positions (NoPE)
        return ServedPositions(scheme, head_dim, layers=where)
    max_positions = config.max_position_embeddings
    facts = ModelFacts(hidden_size=config.hidden_size, num_heads=heads, head_dim=head_dim, max_positions=max_positions,
                       causal=True, rope_parameters=None, position_table=None)
    params = spec.rope_parameters(options, facts)
    pairs = int(head_dim * options["partial"]) // 2
    # the dimensions left unrotated take the attention factor (YaRN's temperature) as hf-posenc's rotation
    # gives them; the rotated ones take it from the engine's own rotary module
    rest = Rotary(head_dim, params, options["partial"], max_positions).inner.attention_scaling \
        if 0 < pairs < head_dim // 2 else 1.0
    return ServedPositions(scheme, head_dim, rope_parameters=params if pairs else None, rotated_pairs=pairs,
                           rest_scale=float(rest), layers=where)
