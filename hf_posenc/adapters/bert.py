"""BERT family: learned absolute table inside `embeddings`, separate q/k projections.

RoBERTa numbers positions from `padding_idx + 1`; DistilBERT has no token types.
"""

from ..registry import register_adapter
from .base import Adapter, QKTap

BERT = register_adapter(
    Adapter(
        name="bert",
        model_types=("bert",),
        native="learned",
        causal=False,
        layers="encoder.layer",
        attention="attention.self",
        position_slot="embeddings.position_embeddings",
        token_type_ids=True,
        other_embeddings=("embeddings.token_type_embeddings",),
        qk=QKTap(projections=("query", "key")),
    )
)

ROBERTA = register_adapter(
    Adapter(
        name="roberta",
        model_types=("roberta", "xlm-roberta"),
        native="learned",
        causal=False,
        layers="encoder.layer",
        attention="attention.self",
        position_slot="embeddings.position_embeddings",
        position_offset=lambda config: config.pad_token_id + 1,
        token_type_ids=True,
        other_embeddings=("embeddings.token_type_embeddings",),
        qk=QKTap(projections=("query", "key")),
    )
)

DISTILBERT = register_adapter(
    Adapter(
        name="distilbert",
        model_types=("distilbert",),
        native="learned",
        causal=False,
        layers="transformer.layer",
        attention="attention",
        position_slot="embeddings.position_embeddings",
        qk=QKTap(projections=("q_lin", "k_lin")),
    )
)
