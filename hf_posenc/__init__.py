"""hf-posenc: swap the positional-encoding scheme of a transformers model with one call."""

from typing import Any

from .config import LayerMap, PosEncConfig
from .errors import PosEncError, Unsupported
from .version import __version__

__all__ = [
    "LayerMap",
    "PosEncConfig",
    "PosEncError",
    "Unsupported",
    "describe",
    "export_gguf",
    "from_pretrained",
    "list_architectures",
    "list_schemes",
    "load_tokenizer",
    "patch",
    "register_adapter",
    "register_scheme",
    "supports",
    "unpatch",
    "validate",
]

def __getattr__(name: str) -> Any:
    """Everything but the config and the error imports torch and transformers: only when first
    used, so that `hf-posenc --help` and `hf-posenc list` start at once. Kept once found (each call of `hp.patch`
    is then the function itself)."""
    if name in ("describe", "patch", "unpatch", "validate"):
        from . import patching as module
    elif name in ("list_architectures", "list_schemes", "supports"):
        from . import catalog as module
    elif name == "register_adapter":
        from .adapters import base as module
    elif name == "register_scheme":
        from .schemes import base as module
    elif name == "export_gguf":
        from .serving.gguf import export as module
    elif name in ("from_pretrained", "load_tokenizer"):
        from . import loading as module
    else:
        raise AttributeError(f"module 'hf_posenc' has no attribute {name!r}")
    globals()[name] = value = getattr(module, name)
    return value
