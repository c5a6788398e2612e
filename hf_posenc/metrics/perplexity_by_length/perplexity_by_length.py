"""Sliding-window perplexity at each context length, of an in-memory (patched) model.

Each document is cut into windows of `length` tokens starting every `stride` tokens; the first
window scores all its tokens and each later one only the tokens no earlier window scored, with the
rest as context ("Perplexity of fixed-length models" in the transformers docs; Press et al. 2021).
evaluate's own "perplexity" metric reloads a model by id, so it cannot score a patched model; this
one takes the model object. The computation is `hf_posenc.evaluation.perplexity_by_length`.
"""

import math

import datasets
import evaluate
import torch

from hf_posenc.evaluation import perplexity_by_length

_CITATION = """@inproceedings{press2021shortformer,
  title={Shortformer: Better Language Modeling using Shorter Inputs},
  author={Press, Ofir and Smith, Noah A. and Lewis, Mike}, booktitle={ACL}, year={2021}}"""
_KWARGS_DESCRIPTION = """
Args:
    input_ids (list of list of int): token ids of one or more long documents.
    model (PreTrainedModel): a causal LM object, patched or not.
    lengths (list of int): context lengths in tokens.
    stride (int, optional): tokens between window starts (default: the length).
    batch_size (int): windows per forward pass.
    max_windows (int, optional): windows per document and length.
Returns:
    by_length (dict): length -> {"perplexity", "loss", "tokens", "windows"}, token-weighted over
    documents, or {"skipped": reason} when no document could be scored at that length.
Example:
    >>> m = evaluate.load("hf_posenc/metrics/perplexity_by_length")
    >>> m.compute(input_ids=[ids], model=model, lengths=[512, 2048], stride=256)
"""


class PerplexityByLength(evaluate.Metric):
    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description=__doc__,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int64"))}),
        )

    def _compute(self, input_ids, model, lengths, stride=None, batch_size=1, max_windows=None) -> dict:
        totals = {length: {"nll": 0.0, "tokens": 0, "windows": 0, "skipped": []} for length in lengths}
        for doc in input_ids:
            scored = perplexity_by_length(model, torch.tensor(doc), lengths, stride, batch_size, max_windows)
            for length, cell in scored.items():
                total = totals[length]
                if "skipped" in cell:
                    total["skipped"].append(cell["skipped"])
                    continue
                total["nll"] += cell["loss"] * cell["tokens"]
                total["tokens"] += cell["tokens"]
                total["windows"] += cell["windows"]
        by_length = {}
        for length, total in totals.items():
            if total["tokens"] == 0:
                by_length[length] = {"skipped": "; ".join(sorted(set(total["skipped"]))) or "no tokens scored"}
            else:
                loss = total["nll"] / total["tokens"]
                by_length[length] = {"perplexity": math.exp(loss), "loss": loss, "tokens": total["tokens"],
                                     "windows": total["windows"]}
        return {"by_length": by_length}
