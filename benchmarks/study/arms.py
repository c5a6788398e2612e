"""The study's arms: one positional scheme each on the same GPT-2-shaped decoder, as data.

Every arm trains the same depth, heads, tokenizer, data, optimizer, token budget and seeds; only how
positions enter differs (and, for `concat_wide`, the width that keeps the token capacity of `learned`).
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Arm:
    """scheme: what `hf_posenc.patch` installs (None: GPT-2's own learned table), a name or a layer map
    {scheme: layers} covering every layer; extra_width: dims added to the model width; added: positions are
    vectors added to the token embeddings, so the position-vs-token subspace geometry and the four attention
    terms are tracked over checkpoints."""

    scheme: str | dict[str, list[int]] | None
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    extra_width: int = 0
    added: bool = False

    @property
    def layered(self) -> bool:
        """A layer map: the recipe's `posenc.scheme` takes one name, so the map is patched into the init model."""
        return isinstance(self.scheme, dict)


def nope_every(n: int, layers: int) -> dict[str, list[int]]:
    """RoPE in every layer but each n-th (layers n-1, 2n-1, ...), which has none: SmolLM3's and Llama 4's
    `no_rope_layer_interval` (n = 4 there). A model shallower than n has RoPE only."""
    nope = [i for i in range(layers) if (i + 1) % n == 0]
    return {"rope": [i for i in range(layers) if i not in nope], **({"nope": nope} if nope else {})}


def arms(width: int, layers: int) -> dict[str, Arm]:
    """The arms of issue 14, and those added since, for a model of this width and depth."""
    return {
        "learned": Arm(None, added=True),
        "sinusoidal": Arm("sinusoidal", added=True),
        "concat_d8": Arm("concat", {"d_pos": width // 8}, added=True),  # same width: tokens lose d/8 dims
        "concat_d4": Arm("concat", {"d_pos": width // 4}, added=True),
        "concat_wide": Arm("concat", {"d_pos": width // 4}, extra_width=width // 4, added=True),  # tokens keep d
        "untied": Arm("untied"),
        "rope": Arm("rope"),
        "alibi": Arm("alibi"),
        "t5": Arm("t5"),
        "nope": Arm("nope"),
        # added after the first 30 runs, for the schemes that followed the issue
        "p_rope": Arm("p_rope", {"p": 0.5}),  # Barbero et al. 2025 (arXiv 2410.06205): RoPE's top half of frequencies
        "pope": Arm("pope"),  # Gopalakrishnan et al. 2025 (arXiv 2509.10534): polar, what and where decoupled
        "cope": Arm("cope"),  # Golovneva et al. 2024 (arXiv 2405.18719): positions counted by the content
        "nope_every4": Arm(nope_every(4, layers)),  # SmolLM3 / Llama 4: RoPE, and NoPE in every 4th layer
    }
