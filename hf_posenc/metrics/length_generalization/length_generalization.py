"""Exact-match accuracy by input length, for length-generalisation tasks (copy, reverse, addition).

Models are trained on short inputs and tested on longer ones (Zaremba & Sutskever 2014; Anil et al.
2022, "Exploring Length Generalization in Large Language Models"); the curve of exact match against
length shows where a positional scheme stops generalising.
"""

from collections import defaultdict

import datasets
import evaluate

_CITATION = """@inproceedings{anil2022exploring,
  title={Exploring Length Generalization in Large Language Models},
  author={Anil, Cem and others}, booktitle={NeurIPS}, year={2022}}"""
_KWARGS_DESCRIPTION = """
Args:
    predictions (list of str): model outputs.
    references (list of str): expected outputs; compared after stripping surrounding whitespace.
    lengths (list of int): task length (digits) of each example.
Returns:
    exact_match (float): over all examples.
    by_length (dict): length -> exact-match accuracy.
Example:
    >>> m = evaluate.load("hf_posenc/metrics/length_generalization")
    >>> m.compute(predictions=["1 2", "3"], references=["1 2", "4"], lengths=[2, 1])
    {'exact_match': 0.5, 'by_length': {1: 0.0, 2: 1.0}}
"""


class LengthGeneralization(evaluate.Metric):
    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description=__doc__,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({
                "predictions": datasets.Value("string"),
                "references": datasets.Value("string"),
                "lengths": datasets.Value("int64"),
            }),
        )

    def _compute(self, predictions: list[str], references: list[str], lengths: list[int]) -> dict:
        if not references:
            raise ValueError("length_generalization needs at least one example")
        hits: dict[int, list[bool]] = defaultdict(list)
        for pred, ref, length in zip(predictions, references, lengths):
            hits[length].append(pred.strip() == ref.strip())
        by_length = {length: sum(h) / len(h) for length, h in sorted(hits.items())}
        return {"exact_match": sum(map(sum, hits.values())) / len(references), "by_length": by_length}
