"""hf-posenc: swap the positional-encoding scheme of a transformers model with one call."""

from typing import Any

from .config import PosEncConfig
from .errors import PosEncError
from .registry import list_architectures, list_schemes, register_adapter, register_scheme, supports
from .saving import from_pretrained

__version__ = "0.1.0"

__all__ = [
    "PosEncConfig",
    "PosEncError",
    "describe",
    "from_pretrained",
    "list_architectures",
    "list_schemes",
    "patch",
    "register_adapter",
    "register_scheme",
    "supports",
    "unpatch",
]


def __getattr__(name: str) -> Any:
    """patch / unpatch / describe import torch and transformers: only when first used, so that
    `hf-posenc --help` and `hf-posenc list` start at once."""
    if name in ("describe", "patch", "unpatch"):
        from . import patching

        return getattr(patching, name)
    raise AttributeError(f"module 'hf_posenc' has no attribute {name!r}")
