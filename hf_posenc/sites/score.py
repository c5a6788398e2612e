"""Score site (alibi, t5, fire, kerple, untied): a bias on the attention logits.

The scheme's bias module lives on the layer loop's module (the base model, OPT's decoder) as `posenc_bias`;
the layer-loop hook hands it and the positions of queries and keys to the posenc attention function, which
adds the bias whatever mask arrives.
"""

from __future__ import annotations

import functools

from ..attention import BIAS_KWARG
from .base import install_biased_attention

BIAS_MODULE = "posenc_bias"

install = functools.partial(install_biased_attention, BIAS_MODULE, BIAS_KWARG)
