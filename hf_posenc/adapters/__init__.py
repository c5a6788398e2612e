"""One module per architecture family; importing this package registers them all."""

from . import bert, gpt2, llama  # noqa: F401
