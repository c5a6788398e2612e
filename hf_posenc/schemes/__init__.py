"""One module per scheme family; importing this package registers them all."""

from . import alibi, concat, learned, nope, relative, rope, scaling, self_extend, sinusoidal, untied, xpos  # noqa: F401
from . import cope, fope, hope, p_rope, pope  # noqa: F401  (issue 30)
