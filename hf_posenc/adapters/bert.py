"""BERT family: learned absolute table inside `embeddings`, separate q/k projections.

RoBERTa numbers positions from `padding_idx + 1`; DistilBERT has no token types.
"""

from typing import Any

from .base import Adapter, Blocks, Embeddings, PositionSlot, QKTap, register_adapter


def after_padding(config: Any) -> int:
    """RoBERTa's row of position 0: the one after its padding row."""
    return config.pad_token_id + 1


BERT = register_adapter(
    Adapter(
        name="bert",
        model_types=("bert",),
        native="learned",
        causal=False,
        blocks=Blocks(layers="encoder.layer", attention="attention.self"),
        slot=PositionSlot("embeddings.position_embeddings"),
        embeddings=Embeddings(token_type_ids=True, other=("embeddings.token_type_embeddings",)),
        qk=QKTap(projections=("query", "key")),
    )
)

ROBERTA = register_adapter(
    Adapter(
        name="roberta",
        model_types=("roberta", "xlm-roberta"),
        native="learned",
        causal=False,
        blocks=Blocks(layers="encoder.layer", attention="attention.self"),
        slot=PositionSlot("embeddings.position_embeddings", offset=after_padding),
        embeddings=Embeddings(token_type_ids=True, other=("embeddings.token_type_embeddings",)),
        qk=QKTap(projections=("query", "key")),
    )
)

DISTILBERT = register_adapter(
    Adapter(
        name="distilbert",
        model_types=("distilbert",),
        native="learned",
        causal=False,
        blocks=Blocks(layers="transformer.layer", attention="attention"),
        slot=PositionSlot("embeddings.position_embeddings"),
        qk=QKTap(projections=("q_lin", "k_lin")),
    )
)
