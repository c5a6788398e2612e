"""One module per scheme; importing this package registers them all."""

from . import alibi, concat, fire, kerple, learned, nope, rope, scaling, self_extend, sinusoidal, t5  # noqa: F401
from . import untied, xpos  # noqa: F401
from . import cope, fope, hope, p_rope, pope  # noqa: F401  (issue 30)
