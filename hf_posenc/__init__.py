"""hf-posenc: swap the positional-encoding scheme of a transformers model with one call."""

from .config import PosEncConfig
from .errors import PosEncError
from .patching import describe, patch, unpatch
from .saving import from_pretrained
from .registry import list_architectures, list_schemes, supports

__version__ = "0.1.0"

__all__ = [
    "PosEncConfig",
    "PosEncError",
    "describe",
    "from_pretrained",
    "list_architectures",
    "list_schemes",
    "patch",
    "supports",
    "unpatch",
]
