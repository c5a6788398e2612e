"""One module per scheme family; importing this package registers them all."""

from . import alibi, concat, fire, kerple, learned, nope, rope, scaling, self_extend, sinusoidal, t5  # noqa: F401
from . import untied, xpos  # noqa: F401
