"""Logits site (schemes of site "attention": self_extend, xpos): the scheme computes the q.k logits itself
from unrotated q and k and the positions of both, inside the posenc attention function (keys enter the
cache unrotated). The module lives on the layer loop's module (the base model, OPT's decoder) as
`posenc_attention`."""

from __future__ import annotations

import functools

from ..attention import LOGITS_KWARG
from .base import install_biased_attention

LOGITS_MODULE = "posenc_attention"

install = functools.partial(install_biased_attention, LOGITS_MODULE, LOGITS_KWARG)
