"""Accuracy: the fraction of predictions equal to their reference.

Written here because `evaluate.load("accuracy")` fetches its script from the Hub and fails offline.
"""

import datasets
import evaluate

_DESCRIPTION = "Fraction of predictions equal to the reference label."
_KWARGS_DESCRIPTION = """
Args:
    predictions (list of int): predicted labels.
    references (list of int): true labels.
Returns:
    accuracy (float): in [0, 1].
Example:
    >>> evaluate.load("hf_posenc/metrics/accuracy").compute(predictions=[0, 1], references=[1, 1])
    {'accuracy': 0.5}
"""


class Accuracy(evaluate.Metric):
    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": datasets.Value("int64"), "references": datasets.Value("int64")}),
        )

    def _compute(self, predictions: list[int], references: list[int]) -> dict[str, float]:
        if not references:
            raise ValueError("accuracy needs at least one prediction/reference pair")
        return {"accuracy": sum(p == r for p, r in zip(predictions, references)) / len(references)}
