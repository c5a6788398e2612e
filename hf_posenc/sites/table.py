"""The site modules by the names schemes give (`Scheme.site`), and the questions asked of them: what a site needs
of a model, and why it cannot act on one (`site_refusal`, over a view's stacks `stacks_refusal`; the public question
is `catalog.why_not`)."""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any

from . import embedding, logits, qk, removal, score

from ..errors import PosEncError

if TYPE_CHECKING:
    from ..adapters.base import Adapter
    from ..schemes.base import Scheme
    from ..view import ModelView

SITES: dict[str, ModuleType] = {"input": embedding, "qk": qk, "score": score, "attention": logits, "none": removal}


def needs(adapter: Adapter, spec: Scheme, keeps_slot: bool = False) -> tuple[str, ...]:
    """What the site of `spec` must do to this model (keys of adapters.base.MECHANISMS): switching off a native
    score bias first, then the site's own (`keeps_slot`: a per-layer entry, whose layers leave the position slot to
    the others, takes nothing away from it)."""
    native = ["native_bias"] if adapter.bias.argument or adapter.bias.table else []
    return tuple(native + [m for m in SITES[spec.site].needs(adapter, spec) if not (keeps_slot and m == "slot")])


def site_refusal(adapter: Adapter, spec: Scheme, keeps_slot: bool = False) -> str | None:
    """Why the site of `spec` cannot act on the model `adapter` describes (None if it can): a causal-only scheme on a
    bidirectional model, or the first mechanism the site needs that the adapter names as a gap."""
    if spec.causal_only and not adapter.causal:
        return f"{spec.name!r} needs a causal model"
    wanted = needs(adapter, spec, keeps_slot)
    gap = next((f"{m}: {adapter.gaps[m]}" for m in wanted if m in adapter.gaps), None)
    return gap or ("qk_tap: no q/k projections to rotate" if "qk_tap" in wanted and adapter.qk is None else None)


def stacks_refusal(view: ModelView, spec: Scheme, names: tuple[str | None, ...] | None = None) -> str | None:
    """`site_refusal` over the stacks of `view` in `names` (default: those that read text): None if every one takes
    `spec`, else the first reason (an encoder-decoder's named by its stack). Asked afresh each time: a few lookups in
    the adapters' gaps, read once per config by the view."""
    if not view.two_stacks:
        return site_refusal(view.stacks[0].adapter, spec)
    names = names or view.text
    if not names:
        return view.no_text
    for name in names:
        try:
            reason = site_refusal(view.adapter(name), spec)
        except PosEncError as exc:
            reason = str(exc)
        if reason is not None:
            return f"{name}: {reason}"
    return None


def kind(spec: Scheme) -> str | None:
    """What analysis calls the positions `spec` gives (absolute, rotary, none); None for a bias or logits term."""
    return getattr(SITES[spec.site], "KIND", None)


def title(spec: Scheme) -> str:
    """Where `spec` acts, as a model card says it."""
    return getattr(SITES[spec.site], "TITLE", spec.site)


def probe(spec: Scheme) -> tuple[str, dict[str, Any]]:
    """The scheme (and options) standing for the site of `spec` in the self-check's "takes effect"."""
    return SITES[spec.site].PROBE


def probes() -> list[tuple[str, dict[str, Any]]]:
    """The scheme standing for each site in the self-check's "takes effect"."""
    return [module.PROBE for module in SITES.values()]
