"""Llama family (Llama, Mistral, Qwen2, Qwen3, SmolLM): rotates natively through `rotary_emb`.

RoPE changes are config (`rope_parameters`) plus a rebuilt rotary module; Qwen3's q/k norms and
Mistral's sliding window need nothing extra because the rotation stays where the model puts it.
"""

from ..registry import register_adapter
from .base import Adapter

LLAMA = register_adapter(
    Adapter(
        name="llama",
        model_types=("llama", "mistral", "qwen2", "qwen3"),
        native="rope",
        causal=True,
        layers="layers",
        attention="self_attn",
        rotary="rotary_emb",
    )
)
