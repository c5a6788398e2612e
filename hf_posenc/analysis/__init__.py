"""Look at positions inside a model: subspace geometry, the four attention terms, the encoding itself.

The question behind it: positions are *added* to word embeddings, not concatenated. If the word
subspace and the position subspace are nearly orthogonal, adding costs little (it is concatenation in
a rotated basis); if attention mostly uses the content-content term, positions are cheap passengers.
This package measures both on a real model; `hf-posenc inspect MODEL --out DIR` writes JSON + PNG.

    positions        where positions enter a model and the vectors it adds
    geometry         principal angles and energy shares against random subspaces
    encoding         the code itself: is a shift a linear map of it (why sine and cosine), and where
                     its energy sits (per dimension, per token singular direction)
    logit_terms      the layer-0 logit split into its four terms; RoPE's and ALiBi's replacements
    report           `inspect_model`: every analysis that applies, as inspect.json and plots
"""

from .logit_terms import BIAS_TERMS, TERMS, FourTerms, alibi_slopes, four_terms, rotary_cos, rotary_profile
from .encoding import energy_by_direction, format_encoding, quarter_shares, shift_fit
from .geometry import (
    encoding_by_distance,
    energy_share,
    format_geometry,
    principal_angles,
    principal_basis,
    random_basis,
    subspace_geometry,
)
from .positions import (
    check_length,
    head_shape,
    max_positions,
    position_kind,
    position_vectors,
    qk_modules,
    token_vectors,
)
from .report import added_positions, inspect_model

__all__ = [
    "BIAS_TERMS",
    "TERMS",
    "FourTerms",
    "added_positions",
    "alibi_slopes",
    "check_length",
    "encoding_by_distance",
    "energy_by_direction",
    "energy_share",
    "format_encoding",
    "format_geometry",
    "four_terms",
    "head_shape",
    "inspect_model",
    "max_positions",
    "position_kind",
    "position_vectors",
    "principal_angles",
    "principal_basis",
    "qk_modules",
    "quarter_shares",
    "random_basis",
    "rotary_cos",
    "rotary_profile",
    "shift_fit",
    "subspace_geometry",
    "token_vectors",
]
