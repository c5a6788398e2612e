"""The tables SCHEMES and ADAPTERS, and `register_*` to fill them: a leaf every module may import.

Schemes and adapters register themselves at import (peft-style); names must be unique. Questions about the
tables (which adapter, which schemes, why not) are `hf_posenc.catalog`'s: it sits above what registers here.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .adapters.base import Adapter
    from .schemes.base import Scheme

# What `hf-posenc list` prints and the built-in schemes' options `PosEncConfig` checks, written by
# `catalog.write_snapshot()`: the catalog imports torch, the list and the option checks must not.
SNAPSHOT = Path(__file__).with_name("support.json")
# The generic adapter's verdict per causal-LM model type, checked by the zoo sweep (benchmarks/zoo_catalog.py).
MODEL_TYPES = Path(__file__).with_name("model_types.json")
# The same for encoder-decoder model types, stack by stack (benchmarks/seq2seq_catalog.py).
SEQ2SEQ_TYPES = Path(__file__).with_name("seq2seq_types.json")
SCHEMES: dict[str, "Scheme"] = {}
ADAPTERS: dict[str, "Adapter"] = {}  # model_type -> adapter


def register_scheme(scheme: "Scheme") -> "Scheme":
    """Make `scheme` patchable by its name (docs/extending.md); a name is taken once per process.

    Args:
        scheme: an instance of a `hf_posenc.schemes.base` site class (`BiasScheme`, `RotaryScheme`, ...).
    """
    if scheme.name in SCHEMES:
        raise ValueError(f"scheme {scheme.name!r} is already registered")
    SCHEMES[scheme.name] = scheme
    return scheme


def register_adapter(adapter: "Adapter") -> "Adapter":
    """Use `adapter` instead of the generic one for its model types (docs/extending.md); once per type.

    Args:
        adapter: a `hf_posenc.adapters.base.Adapter` naming where positions enter those model types.
    """
    for model_type in adapter.model_types:  # all checked before any is taken: no half-registered adapter
        if model_type in ADAPTERS:
            raise ValueError(f"model_type {model_type!r} already has adapter {ADAPTERS[model_type].name!r}")
    ADAPTERS.update(dict.fromkeys(adapter.model_types, adapter))
    return adapter
