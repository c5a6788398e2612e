"""Perplexity at each context length, pooled over documents by their token counts.

`hf_posenc.evaluation.perplexity_by_length` scores one document of an in-memory (patched) model, on
the same target tokens at every length or with sliding windows ("Perplexity of fixed-length models"
in the transformers docs; Press et al. 2021);
this module pools its cells over several documents: the pooled loss is the token-weighted mean of the
documents' losses. (evaluate's own "perplexity" metric reloads a model by id, so it cannot score a
patched model.)
"""

import math
from collections import defaultdict

import datasets
import evaluate

_CITATION = """@inproceedings{press2021shortformer,
  title={Shortformer: Better Language Modeling using Shorter Inputs},
  author={Press, Ofir and Smith, Noah A. and Lewis, Mike}, booktitle={ACL}, year={2021}}"""
_KWARGS_DESCRIPTION = """
Args:
    lengths (list of int): context length of each (document, length) cell.
    losses (list of float): mean nats per scored token of the cell.
    tokens (list of int): tokens scored in the cell (0 for a document too short for the length).
    windows (list of int): windows scored in the cell.
Returns:
    by_length (dict): length -> {"perplexity", "loss", "tokens", "windows"} over all documents, or
    {"skipped": reason} when no document could be scored at that length.
Example:
    >>> cells = [hf_posenc.evaluation.perplexity_by_length(model, doc, [512])[512] for doc in docs]
    >>> m = evaluate.load("hf_posenc/metrics/perplexity_by_length")
    >>> m.compute(lengths=[512] * len(cells), losses=[c.get("loss", 0.0) for c in cells],
    ...           tokens=[c.get("tokens", 0) for c in cells], windows=[c.get("windows", 0) for c in cells])
"""


class PerplexityByLength(evaluate.Metric):
    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description=__doc__,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({
                "lengths": datasets.Value("int64"),
                "losses": datasets.Value("float64"),
                "tokens": datasets.Value("int64"),
                "windows": datasets.Value("int64"),
            }),
        )

    def _compute(self, lengths: list[int], losses: list[float], tokens: list[int], windows: list[int]) -> dict:
        totals = defaultdict(lambda: [0.0, 0, 0])  # length -> nll, tokens, windows
        for length, loss, n, w in zip(lengths, losses, tokens, windows):
            total = totals[length]
            total[0] += loss * n
            total[1] += n
            total[2] += w
        by_length = {}
        for length in sorted(totals):
            nll, n, w = totals[length]
            by_length[length] = ({"perplexity": math.exp(nll / n), "loss": nll / n, "tokens": n, "windows": w} if n
                                 else {"skipped": "no document was long enough to score at this length"})
        return {"by_length": by_length}
