"""GPT-2: learned absolute table `wpe`; q, k, v leave one Conv1D `c_attn` packed as [q | k | v]."""

from .base import Adapter, Blocks, PositionSlot, QKTap, register_adapter

GPT2 = register_adapter(
    Adapter(
        name="gpt2",
        model_types=("gpt2",),
        native="learned",
        causal=True,
        blocks=Blocks(layers="h", attention="attn"),
        slot=PositionSlot("wpe"),
        qk=QKTap(projections=("c_attn",), packed=True),
    )
)
