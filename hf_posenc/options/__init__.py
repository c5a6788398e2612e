"""The options of every built-in scheme, declared with their domains, torch-free: `PosEncConfig` checks a
user's options (and the CLI refuses a bad one) without importing torch; each scheme module takes its
`Options` from here. User-defined schemes bring their own (`hf_posenc.register_scheme`)."""

from __future__ import annotations

from .bias import AlibiOptions, FireOptions, KerpleOptions, T5Options, UntiedOptions
from .contextual import CopeOptions
from .frequency import FopeOptions, HopeOptions, PopeOptions, PRopeOptions
from .input import ConcatOptions, LearnedOptions, NopeOptions, SinusoidalOptions
from .rotary import (Llama3Options, LongRopeOptions, RopeOptions, ScalingOptions, SelfExtendOptions, XposOptions,
                     YarnOptions)

OPTIONS: dict[str, type] = {
    "alibi": AlibiOptions, "fire": FireOptions, "kerple": KerpleOptions, "t5": T5Options, "untied": UntiedOptions,
    "concat": ConcatOptions, "learned": LearnedOptions, "nope": NopeOptions, "sinusoidal": SinusoidalOptions,
    "rope": RopeOptions, "linear": ScalingOptions, "dynamic": ScalingOptions, "ntk": ScalingOptions,
    "yarn": YarnOptions, "llama3": Llama3Options, "longrope": LongRopeOptions, "self_extend": SelfExtendOptions,
    "xpos": XposOptions, "p_rope": PRopeOptions, "hope": HopeOptions,
    "fope": FopeOptions, "pope": PopeOptions, "cope": CopeOptions,
}
