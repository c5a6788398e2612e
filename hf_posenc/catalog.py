"""Questions over the registered schemes and adapters, each answered by looping over views (`hf_posenc.view`):
which adapter a model takes, which schemes it supports and why not, the support matrix and its snapshot. Off the
patch path: `patch` reads its model once, through `hf_posenc.plan`, and asks here only to name what a refused model
does take. Importing it registers every built-in scheme and adapter; their tables (`schemes.base.SCHEMES`,
`adapters.base.ADAPTERS`) sit beside their contracts and know nothing of these questions."""

from __future__ import annotations

import json
from typing import Any

from torch import nn

from . import sites
from .adapters.base import ADAPTERS, Adapter
from .config import options_snapshot
from .errors import PosEncError, did_you_mean
from .paths import SNAPSHOT
from .schemes.base import SCHEMES, Scheme
from .view import model_type_of, read, stock

__all__ = ["adapter_for", "get_scheme", "list_architectures", "list_schemes", "model_type_of", "snapshot",
           "stock_meta", "support_matrix", "supported_schemes", "supports", "why_not",
           "write_snapshot"]


def list_schemes() -> list[str]:
    return sorted(SCHEMES)


def list_architectures() -> list[str]:
    return sorted(ADAPTERS)


def get_scheme(name: str) -> Scheme:
    if name not in SCHEMES:
        raise PosEncError(f"unknown scheme {name!r}{did_you_mean(name, SCHEMES)}; available schemes: "
                          f"{', '.join(sorted(SCHEMES))}")
    return SCHEMES[name]


def adapter_for(model_or_config: Any) -> Adapter:
    """The adapter of a model (or config) of one stack: the hand-written one of its model type, else the generic
    one read from the model itself (a PosEncError says what it could not place, or that the model has two stacks,
    each with an adapter of its own)."""
    return read(model_or_config, one_stack=True).only()


def stock_meta(config: Any) -> nn.Module:
    """The stock model of a transformers config on the meta device, as its adapter reads it."""
    return stock(config, read(config), (None,))[0].module


def supported_schemes(model_or_config: Any) -> list[str]:
    view = read(model_or_config)
    return sorted(name for name, scheme in SCHEMES.items() if sites.stacks_refusal(view, scheme) is None)


def why_not(model_or_config: Any, scheme: str, stacks: tuple[str, ...] | None = None) -> str | None:
    """None if `scheme` can be patched into this model (or config), else the reason it cannot.

    Args:
        model_or_config: a model, or a transformers config.
        scheme: a scheme name.
        stacks: an encoder-decoder's stacks to ask about ("encoder", "decoder"; default: those that read text).
    """
    return sites.stacks_refusal(read(model_or_config), get_scheme(scheme), stacks)


def supports(model_or_config: Any, scheme: str) -> bool:
    """True if `scheme` can be patched into this model (or config); the support matrix."""
    try:
        return get_scheme(scheme).name in supported_schemes(model_or_config)
    except PosEncError:
        return False


def support_matrix() -> dict[str, dict[str, bool]]:
    """{adapter name: {scheme: supported}} for docs and `hf-posenc list`."""
    by_name = {a.name: a for a in ADAPTERS.values()}
    return {name: {s: sites.site_refusal(a, SCHEMES[s]) is None for s in sorted(SCHEMES)}
            for name, a in sorted(by_name.items())}


def snapshot() -> dict[str, Any]:
    """The registry as data: architectures, {scheme: [site, citation]}, each scheme's options (what `PosEncConfig`
    checks without torch) and the support matrix."""
    return {"architectures": list_architectures(),
            "schemes": {name: [scheme.site, scheme.citation] for name, scheme in sorted(SCHEMES.items())},
            "options": {name: options_snapshot(scheme.Options) for name, scheme in sorted(SCHEMES.items())},
            "matrix": support_matrix()}


def write_snapshot() -> None:
    """Refresh `SNAPSHOT` after adding a scheme or an adapter (tests/test_cli.py checks it is current)."""
    SNAPSHOT.write_text(json.dumps(snapshot(), indent=1, sort_keys=True) + "\n", encoding="utf-8")
