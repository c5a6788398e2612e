"""F1 score (harmonic mean of precision and recall), via scikit-learn.

Written here because `evaluate.load("f1")` fetches its script from the Hub and fails offline.
"""

import datasets
import evaluate
from sklearn.metrics import f1_score

_DESCRIPTION = "F1 = 2 * precision * recall / (precision + recall); macro/micro/weighted averages for multi-class."
_KWARGS_DESCRIPTION = """
Args:
    predictions (list of int): predicted labels.
    references (list of int): true labels.
    average (str): "binary" (default; scores `pos_label`), "macro", "micro" or "weighted".
    pos_label (int): the positive class for average="binary"; default 1.
Returns:
    f1 (float): in [0, 1].
Example:
    >>> evaluate.load("hf_posenc/metrics/f1").compute(predictions=[0, 1, 1], references=[0, 1, 0])
    {'f1': 0.6666666666666666}
"""


class F1(evaluate.Metric):
    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": datasets.Value("int64"), "references": datasets.Value("int64")}),
        )

    def _compute(self, predictions: list[int], references: list[int], average: str = "binary", pos_label: int = 1) -> dict[str, float]:
        return {"f1": float(f1_score(references, predictions, average=average, pos_label=pos_label, zero_division=0))}
