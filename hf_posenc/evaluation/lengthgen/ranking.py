"""Mean reciprocal rank over task splits, as Kazemnejad et al. (2023, arXiv 2305.19466, Fig. 1 and Sec. 4) rank
positional schemes: in each split the schemes are ranked by out-of-distribution exact match (best = 1; tied
schemes share the best of their ranks), and a scheme's score is the mean of 1/rank over the splits. Torch-free.

`PAPER` holds their numbers as the issue that asked for this study (issue 47) quotes them from the paper and its
repository (github.com/McGill-NLP/length-generalization): decoder-only models of ~107M parameters, 40k steps,
3 seeds, no scratchpad. They are quoted, not recomputed here.
"""

from __future__ import annotations

from collections.abc import Mapping

from ...errors import PosEncError

CITATION = ("Kazemnejad, Padhi, Natesan Ramamurthy, Das, Reddy. The Impact of Positional Encoding on Length "
            "Generalization in Transformers. NeurIPS 2023, arXiv 2305.19466; github.com/McGill-NLP/length-generalization")
# their scheme -> the arm of this study that is it (their Rotary rotates 25% of each head's dimensions)
PAPER_ARMS = {"NoPE": "nope", "T5": "t5", "ALiBi": "alibi", "Rotary": "rope_partial", "APE": "sinusoidal"}
PAPER = {
    "mrr_ood": {"NoPE": 0.69, "T5": 0.55, "ALiBi": 0.50, "Rotary": 0.33, "APE": 0.22},  # 17 task splits, 3 seeds
    "repeat_ood": {"NoPE": 0.99, "T5": 0.77, "ALiBi": 0.29, "Rotary": 0.00, "APE": 0.00},  # train <= 20, test 21-40
    "source": "quoted from issue 47, which cites the paper and its repository's results: " + CITATION,
}


def ranks(scores: Mapping[str, float]) -> dict[str, int]:
    """Competition ranks of one split: 1 for the highest score, tied scores share the best rank (1, 1, 3)."""
    return {name: 1 + sum(other > score for other in scores.values()) for name, score in scores.items()}


def mrr(table: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """split -> {scheme: score} to scheme -> mean reciprocal rank over the splits, best first. Every split must
    score the same schemes (a scheme missing from a split would be ranked on fewer splits than the others)."""
    if not table:
        raise PosEncError("MRR needs at least one task split")
    schemes = set(next(iter(table.values())))
    for split, scores in table.items():
        if set(scores) != schemes:
            raise PosEncError(f"split {split!r} scores {sorted(scores)}, the others {sorted(schemes)}: every split "
                              "must rank the same schemes")
    total = {name: 0.0 for name in schemes}
    for scores in table.values():
        for name, rank in ranks(scores).items():
            total[name] += 1 / rank
    return dict(sorted(((name, value / len(table)) for name, value in total.items()), key=lambda kv: -kv[1]))
