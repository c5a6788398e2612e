"""One module per scheme family; importing this package registers them all."""

from . import alibi, learned, nope, rope, scaling, sinusoidal  # noqa: F401
