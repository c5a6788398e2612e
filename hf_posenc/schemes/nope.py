"""`nope`: no positional information at all (Kazemnejad et al. 2023, "The Impact of Positional
Encoding on Length Generalization in Transformers"). On a RoPE model this drops the rotation."""

from __future__ import annotations

from dataclasses import dataclass

from .base import Scheme, register_scheme


@dataclass(frozen=True)
class NopeOptions:
    """NoPE takes no options."""


class Nope(Scheme):
    name = "nope"
    site = "none"
    Options = NopeOptions
    citation = "Kazemnejad et al. 2023"
    test_settings = {"nope": {}, "nope-l1": {"layers": [1]}}
    served = True


register_scheme(Nope())
