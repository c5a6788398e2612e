"""Llama family (Llama, Mistral, Qwen2, Qwen3, SmolLM): rotates natively through `rotary_emb`.

RoPE changes are config (`rope_parameters`) plus a rebuilt rotary module; Mistral's sliding window
needs nothing extra. Schemes transformers cannot express (xPos) switch the native rotation off and
tap q/k where the model would rotate them: after the projections, or after Qwen3's q/k norms.
"""

from .base import Adapter, Blocks, QKTap, Rotation, register_adapter

LLAMA = register_adapter(
    Adapter(
        name="llama",
        model_types=("llama", "mistral", "qwen2"),
        native="rope",
        causal=True,
        blocks=Blocks(layers="layers", attention="self_attn"),
        rotation=Rotation("rotary_emb"),
        qk=QKTap(projections=("q_proj", "k_proj")),
    )
)

QWEN3 = register_adapter(
    Adapter(
        name="qwen3",
        model_types=("qwen3",),
        native="rope",
        causal=True,
        blocks=Blocks(layers="layers", attention="self_attn"),
        rotation=Rotation("rotary_emb"),
        qk=QKTap(projections=("q_norm", "k_norm"), per_head=True),
    )
)
