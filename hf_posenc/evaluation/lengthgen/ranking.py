"""Mean reciprocal rank over task splits, as Kazemnejad et al. (2023, arXiv 2305.19466, Fig. 1 and Sec. 4) rank
positional schemes: in each column (their notebook makes one per task split and seed) the schemes are ranked by
out-of-distribution exact match, best = 1, and a scheme's score is the mean of 1/rank over the columns. Ties: their
notebook ranks with pandas' `method="first"`, which orders tied schemes by their row; here tied schemes share the
best of their ranks, since at this size many schemes tie at 0.00 and row order would decide. Torch-free.

`PAPER` holds their published numbers, read from their repository (github.com/McGill-NLP/length-generalization,
results at commit d06170ec): decoder-only models built from the t5-base configuration (~138M parameters), 40k
steps, 3 seeds, no scratchpad. They are quoted, not recomputed here.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping

from ...errors import PosEncError

CITATION = ("Kazemnejad, Padhi, Natesan Ramamurthy, Das, Reddy. The Impact of Positional Encoding on Length "
            "Generalization in Transformers. NeurIPS 2023, arXiv 2305.19466; github.com/McGill-NLP/length-generalization")
# their scheme -> the arm of this study that is it (their Rotary rotates 25% of each head's dimensions)
PAPER_ARMS = {"NoPE": "nope", "T5": "t5", "ALiBi": "alibi", "Rotary": "rope_partial", "APE": "sinusoidal"}
PAPER_SEEDS = (146317, 234054, 256788)
PAPER = {
    # notebooks/plot_aggregate_final.ipynb (column mrr): 17 task splits x 3 seeds, out of distribution
    "mrr_ood": {"NoPE": 0.686928, "T5": 0.549020, "ALiBi": 0.502288, "Rotary": 0.329739, "APE": 0.215359},
    # our task -> their split and test exact match (sum__pred/test_acc_overall) per seed, in PAPER_SEEDS' order
    # (results/sanity_check.jsonl, results/classic.jsonl: job_type best_run_seed_exp)
    "by_task": {
        "repeat": {"split": "rsc (repeat one symbol), train lengths <= 20, test 21-40",
                   "ood_by_seed": {"NoPE": (0.9835, 0.9808, 0.9925), "T5": (0.7423, 0.8321, 0.7393),
                                   "ALiBi": (0.279, 0.2655, 0.3234), "Rotary": (0.0006, 0.0, 0.0),
                                   "APE": (0.0, 0.0, 0.0)}},
        "copy": {"split": "cmc (copy a random string over up to 100 symbols), train <= 20, test 21-40; "
                          "in distribution only ~0.89 for every scheme",
                 "ood_by_seed": {"NoPE": (0.2896, 0.2944, 0.3322), "T5": (0.4154, 0.4082, 0.435),
                                 "ALiBi": (0.3192, 0.344, 0.3299), "Rotary": (0.0032, 0.0133, 0.0177),
                                 "APE": (0.0227, 0.0322, 0.0283)}},
        "reverse": {"split": "mc (reverse), train <= 20, test 21-40",
                    "ood_by_seed": {"NoPE": (0.236, 0.2355, 0.2187), "T5": (0.2298, 0.2686, 0.2284),
                                    "ALiBi": (0.1654, 0.1632, 0.184), "Rotary": (0.0406, 0.1635, 0.028),
                                    "APE": (0.018, 0.0148, 0.0363)}},
    },
    # their sort's accuracies are published as a figure only; the notebook keeps each seed's rank (the same in all 3)
    "sort_rank": {"split": "sort, single-token, train lengths <= 8, test 9-16",
                  "rank": {"NoPE": 1, "T5": 2, "ALiBi": 3, "Rotary": 4, "APE": 5}},
    "source": "their repository's results (results/*.jsonl and notebooks/plot_aggregate_final.ipynb at commit "
              "d06170ec6b7722ff97de3663fa99c8ac88340409): " + CITATION,
}


def paper_ood(task: str) -> dict[str, float]:
    """Their out-of-distribution exact match on our `task`, the mean over their three seeds ({} if not published)."""
    seeds = PAPER["by_task"].get(task, {}).get("ood_by_seed", {})
    return {scheme: statistics.mean(values) for scheme, values in seeds.items()}


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
