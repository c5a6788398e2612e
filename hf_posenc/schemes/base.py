"""What every scheme shares: its site, its options, and one call contract per site.

A scheme knows only maths (lucidrains-style contracts):
- input site:  `module(options, facts)` -> nn.Module, `forward(position_ids (B, L)) -> (B|1, L, d)`
- q/k site:    `rotary(options, facts, max_positions)` -> nn.Module, `forward(x, position_ids)` ->
               (cos, sin). RoPE-type schemes also give transformers `rope_parameters`, so natively
               rotating models take them as config.
- score site:  `module(options, facts)` -> nn.Module, `forward(q_pos (B, q), k_pos (B, k))` ->
               (B|1, H, q, k) fp32 logit bias, built from elementwise ops of (head, q_pos, k_pos); k_pos
               are the positions of the keys the layer holds (see `hf_posenc.attention`)
- attention:   `module(options, facts)` -> nn.Module, `forward(query, key, q_pos, k_pos)` -> (B, H, q, k)
               fp32 q.k logits from unrotated q/k (schemes that need both positions inside the product:
               Self-Extend's two rotations, xPos's decay centred on the window)
- none:        removes the model's own positions and adds nothing (NoPE)
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from torch import nn

from ..config import OPTIONS
from .rotary import Rotary

Site = Literal["input", "qk", "score", "attention", "none"]


@dataclass(frozen=True)
class ModelFacts:
    """What a scheme may know about the model it goes into (gathered by the adapter)."""

    hidden_size: int
    num_heads: int
    head_dim: int
    max_positions: int
    causal: bool
    rope_parameters: dict[str, Any] | None  # the model's own, if it rotates natively
    position_table: torch.Tensor | None = None  # the model's own learned table (raw rows), if it has one
    position_offset: int = 0  # table row of position 0 (RoBERTa: padding_idx + 1)
    ids_offset: int = 0  # what position ids handed to the model add to a position (the row, unless its slot adds it)
    bias_table: torch.Tensor | None = None  # the model's own (buckets, heads) relative bias table (T5)
    bias_max_distance: int | None = None  # ... and the distance its buckets stop growing at
    alibi_scale: float = 1.0  # the model's own ALiBi slopes over the standard ones (Falcon: 1/sqrt(head_dim))
    token_embeddings: torch.Tensor | None = None  # (V, d) input embedding matrix, detached
    dtype: torch.dtype = torch.float32
    device: torch.device = torch.device("cpu")


    @property
    def partial(self) -> float:
        """The fraction of each head's dims the model's own rotation turns (1 where it has none)."""
        return float((self.rope_parameters or {}).get("partial_rotary_factor", 1.0))

    def named(self) -> dict[str, Any]:
        """The facts option domains name (`hf_posenc.domains.FACTS`), as the CLI also reads them from config.json."""
        return {"hidden_size": self.hidden_size, "num_heads": self.num_heads, "head_dim": self.head_dim,
                "partial": self.partial}

    @functools.cached_property
    def token_rms(self) -> float:
        """RMS of the token embedding entries, to size new position codes (computed on demand:
        a pass over a large vocabulary is most of what a patch would otherwise cost)."""
        if self.token_embeddings is None:
            return 1.0
        return float(self.token_embeddings.float().pow(2).mean().sqrt())


    @functools.cached_property
    def position_rms(self) -> float:
        """RMS of the model's own position vectors, else of its tokens: the magnitude a new position
        code should have to sit in the model the way its old positions did."""
        if self.position_table is None:
            return self.token_rms
        return float(self.position_table.float().pow(2).mean().sqrt())


class Scheme:
    name: ClassVar[str]
    site: ClassVar[Site]
    Options: ClassVar[type]
    citation: ClassVar[str] = ""
    causal_only: ClassVar[bool] = False  # e.g. xPos decay assumes keys precede queries
    # False where a shift of every position changes the logits: absolute positions (the input site, TUPE's table),
    # or a rotation whose (cos, sin) of shifted positions do not cancel in q.k (FoPE's cross terms): a natively
    # rotating model, whose own position_ids ignore padding, then gets the padding-aware ones
    shift_invariant: ClassVar[bool] = True
    # The settings worth testing, by label: the invariant matrix (tests/matrix.py) runs each in every row, so a
    # new scheme is tested by registering it; `layers` makes a setting a per-layer patch. Empty: the scheme with
    # its defaults, labelled with its name.
    test_settings: ClassVar[dict[str, dict[str, Any]]] = {}
    # An inference engine's own layers compute it (no positions, ALiBi slopes, `rope_parameters`), served token for
    # token in tests/test_serving.py; `hf_posenc.serving` refuses every other scheme by name.
    served: ClassVar[bool] = False
    # The patch reads the model's own weights (a position table to copy, the token embeddings' scale or subspace): a
    # model built on the meta device has none, so its `init_weights` cannot give the patch those values back.
    reads_weights: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # what was tested and served of one scheme does not pass to a subclass: another scheme (FoPE of RoPE)
        for attribute, fresh in (("test_settings", {}), ("served", False)):
            if attribute not in vars(cls):
                setattr(cls, attribute, fresh)

    def resolve(self, options: dict[str, Any], facts: ModelFacts) -> dict[str, Any]:
        """Fill options left as None ("take the model's own") from the model."""
        return dict(options)

    def max_positions(self, options: dict[str, Any]) -> int | None:
        """New `max_position_embeddings` to write in the model config, if the scheme sets one."""
        return None

    def fixed_table(self, options: dict[str, Any]) -> bool:
        """The positions come from a table of fixed length, so an input past it is refused (not extrapolated)."""
        return False

    def distance_slopes(self, options: dict[str, Any], num_heads: int) -> torch.Tensor | None:
        """(num_heads,) fp32 slopes m_h where the scheme's whole effect is the logit bias -m_h |i - j| (ALiBi's form,
        which engines and plots take as slopes), else None."""
        return None

    def __repr__(self) -> str:
        return f"<scheme {self.name} ({self.site})>"


class InputScheme(Scheme):
    site: ClassVar[Site] = "input"
    shift_invariant: ClassVar[bool] = False  # a vector per absolute position

    def module(self, options: dict[str, Any], facts: ModelFacts) -> nn.Module:
        raise NotImplementedError


class RotaryScheme(Scheme):
    site: ClassVar[Site] = "qk"
    rope_type: ClassVar[str] = "default"  # the transformers RoPE type it installs on a rotating model
    # config-only: `rope_parameters` say the whole rotation, so on a natively rotating model the patch is the config
    # alone, which plain transformers rebuilds; False where they cannot (p-RoPE, HoPE, FoPE): `rotary` always goes
    # into the model, natively rotating or not
    config_only: ClassVar[bool] = True

    def rope_parameters(self, options: dict[str, Any], facts: ModelFacts) -> dict[str, Any]:
        raise NotImplementedError

    def rotary(self, options: dict[str, Any], facts: ModelFacts, max_positions: int) -> nn.Module:
        return Rotary(facts.head_dim, self.rope_parameters(options, facts), options["partial"], max_positions)


class BiasScheme(Scheme):
    site: ClassVar[Site] = "score"

    def module(self, options: dict[str, Any], facts: ModelFacts) -> nn.Module:
        raise NotImplementedError


class AttentionScheme(Scheme):
    site: ClassVar[Site] = "attention"

    def module(self, options: dict[str, Any], facts: ModelFacts) -> nn.Module:
        raise NotImplementedError


# Every scheme by name, filled by `register_scheme` on the last line of each scheme's module (peft-style).
SCHEMES: dict[str, Scheme] = {}


def register_scheme(scheme: Scheme) -> Scheme:
    """Make `scheme` patchable by its name (docs/extending.md); a name is taken once per process.

    Args:
        scheme: an instance of a `hf_posenc.schemes.base` site class (`BiasScheme`, `RotaryScheme`, ...).
    """
    if scheme.name in SCHEMES:
        raise ValueError(f"scheme {scheme.name!r} is already registered")
    SCHEMES[scheme.name] = scheme
    OPTIONS[scheme.name] = scheme.Options
    return scheme


def check_positions(position_ids: torch.Tensor, limit: int, scheme: str) -> None:
    """Refuse positions past a table with a PosEncError instead of an index error or device assert.
    `position_ids` and `limit` count logical positions (no RoBERTa offset)."""
    if torch.compiler.is_compiling() or position_ids.numel() == 0:
        return
    last = int(position_ids.max())
    if last >= limit:
        from ..errors import PosEncError

        raise PosEncError(
            f"sequence needs position {last} (length {last + 1}) but the {scheme!r} table has {limit} positions; "
            f"patch a relative scheme (rope, alibi, nope, yarn, ...) or {scheme!r} with max_positions >= {last + 1}"
        )


def table_rows(positions: torch.Tensor, scheme: str) -> torch.Tensor:
    """Positions as rows of a table: float positions (which stock rotary models accept) become integers
    when they are whole numbers; fractional ones are refused by name rather than by an index error."""
    if not positions.is_floating_point():
        return positions
    rows = positions.round()
    if not torch.compiler.is_compiling() and not torch.equal(rows, positions):
        from ..errors import PosEncError

        raise PosEncError(f"the {scheme!r} table takes whole-number positions; position_ids holds fractions "
                          f"(e.g. {float(positions[positions != rows].flatten()[0])}): pass integer position_ids")
    return rows.long()


class DerivedBuffers(nn.Module):
    """A module whose buffers are functions of its options (ALiBi slopes, frequencies, kept pairs, zeros), not
    state: `derived()` computes them, and they are not saved. A model built on the meta device (big models,
    FSDP2) gets them back empty from `to_empty`, and the model's own init does not know them, so a patched
    model's init calls `rederive` (`initialise`); trained weights are not touched."""

    def derived(self) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def register_derived(self) -> None:
        for name, value in self.derived().items():
            self.register_buffer(name, value, persistent=False)

    @torch.no_grad()
    def rederive(self) -> None:
        for name, value in self.derived().items():
            getattr(self, name).copy_(value)  # in place: the buffer keeps the device and dtype it was moved to


class EmbeddingDerived(nn.Module):
    """A module whose saved state comes from the model's own weights when the patch is applied (concat's
    token/position split, a copied position table): kept through training and saving, so loading gives it. A model
    built on the meta device and initialised instead (`to_empty` + `init_weights`, nothing loaded) has it empty:
    its init derives it from the embeddings it has just initialised (`rederive_from`), as the patch would have; what was
    loaded (transformers marks it `_is_hf_initialized`; on the tensors, as the class's own init marks every module
    it visits) is kept."""

    def rederive_from(self, embeddings: torch.Tensor) -> None:
        raise NotImplementedError


def loaded(tensor: torch.Tensor | None) -> bool:
    """Whether transformers' loading filled `tensor` (it marks what it loaded)."""
    return getattr(tensor, "_is_hf_initialized", False)


class OwnParameters(nn.Module):
    """A scheme module with parameters of its own (FIRE's MLP, KERPLE's r1 and r2, T5's buckets, ...). Their init is
    the module's: `reset_parameters` draws them as a direct build does (the constructor calls it, so the two cannot
    drift), each only where loading did not fill it. A model built on the meta device and initialised (`to_empty` +
    `init_weights`, nothing loaded) reaches it through the patched model's init (`initialise`): the class's own init
    knows only the `nn.Linear`s and `nn.Embedding`s inside, drawn with its own std, and leaves the rest as
    uninitialised memory. PyTorch's name: FSDP's meta-device init calls it on every module too."""

    def reset_parameters(self) -> None:
        raise NotImplementedError


def initialise(model: nn.Module) -> None:
    """The patch's part of `model`'s init, after the class's: every `OwnParameters` module's parameters that were not
    loaded, the buffers of every `DerivedBuffers` one, and what loading did not fill of every `EmbeddingDerived` one."""
    for module in model.modules():
        if isinstance(module, OwnParameters):
            module.reset_parameters()
        if isinstance(module, DerivedBuffers):
            module.rederive()
        if isinstance(module, EmbeddingDerived):
            module.rederive_from(model.get_input_embeddings().weight)


class TransformedQK(nn.Module):
    """An attention-site module whose logits are a plain dot product of transformed q and k (xpos, pope): subclasses
    give `transformed`, which the fused backends run directly (fast_attention.terms); the dense path is this."""

    def transformed(self, query: torch.Tensor, key: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def forward(self, query: torch.Tensor, key: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        q, k = self.transformed(query, key, q_pos, k_pos)
        return q @ k.transpose(-1, -2)


class RelativeBias(nn.Module):
    """A logit bias given element by element: `score(head, q_pos, k_pos)` takes broadcastable tensors
    (or the 0-d ones FlexAttention's score_mod sees) and returns fp32; `forward` materialises it.
    Biases of the distance alone define `by_distance(head, distance)` instead, which lets fused paths
    build a (q, k) block as a strided view of one row of distances (a Toeplitz matrix)."""

    heads: int
    # Whether Inductor can lower FlexAttention's backward through `score`: it refuses a score_mod that
    # indexes one trainable tensor more than once ("multiple indexing operations"); such terms train chunked.
    flex_backward: bool = True

    def score(self, head: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        return self.by_distance(head, q_pos - k_pos)

    def forward(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """(B, H, q, k) fp32 bias for (B, q) query and (B, k) key positions."""
        head = torch.arange(self.heads, device=q_pos.device)[None, :, None, None]
        return self.score(head, q_pos[:, None, :, None], k_pos[:, None, None, :])


class ZeroPositions(DerivedBuffers):
    """Stands in a position-embedding slot when positions enter elsewhere (or nowhere)."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.zero_dtype = dtype  # at construction: `rederive` keeps the dtype the buffer was moved to
        self.register_derived()

    def derived(self) -> dict[str, torch.Tensor]:
        return {"zero": torch.zeros((), dtype=self.zero_dtype)}

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        return self.zero


class ZeroBuckets(DerivedBuffers):
    """Stands in a T5-style bucket table (`forward(buckets) -> (*buckets.shape, heads)`): the bias the
    stack computes from it and shares down its layers becomes zeros. Its `weight` (zeros, not saved) is
    there for the models that read the table's device from it (LongT5)."""

    def __init__(self, shape: tuple[int, int], dtype: torch.dtype) -> None:
        super().__init__()
        self.table_shape, self.table_dtype = shape, dtype
        self.register_derived()

    def derived(self) -> dict[str, torch.Tensor]:
        return {"weight": torch.zeros(self.table_shape, dtype=self.table_dtype)}

    def forward(self, buckets: torch.Tensor) -> torch.Tensor:
        return self.weight[buckets]
