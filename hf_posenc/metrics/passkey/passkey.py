"""Passkey retrieval accuracy by context length x needle depth.

The task (Mohtashami & Jaggi 2023, "Landmark Attention", used by Chen et al. 2023, "Extending
Context Window of Large Language Models via Positional Interpolation") hides "The pass key is N.
Remember it. N is the pass key." at a depth of repeated filler text and asks for N. A trial is
correct when the model's answer equals N exactly. `hf_posenc.evaluation.passkey` builds the prompts
and runs the model; this module only scores its answers.
"""

from collections import defaultdict

import datasets
import evaluate

_CITATION = """@article{mohtashami2023landmark,
  title={Landmark Attention: Random-Access Infinite Context Length for Transformers},
  author={Mohtashami, Amirkeivan and Jaggi, Martin}, journal={arXiv:2305.16300}, year={2023}}"""
_KWARGS_DESCRIPTION = """
Args:
    predictions (list of str): the model's answers (leading/trailing spaces and a final "." are ignored).
    references (list of str): the hidden pass keys.
    lengths (list of int): context length (tokens) of each trial.
    depths (list of float): needle depth of each trial, 0 = start of the filler, 1 = end.
Returns:
    accuracy (float): over all trials.
    by_length (dict): length -> {"accuracy": float, "by_depth": {depth: float}, "trials": int}.
Example:
    >>> m = evaluate.load("hf_posenc/metrics/passkey")
    >>> m.compute(predictions=["123", "9"], references=["123", "456"], lengths=[1024, 1024], depths=[0.0, 1.0])
    {'accuracy': 0.5, 'by_length': {1024: {'accuracy': 0.5, 'by_depth': {0.0: 1.0, 1.0: 0.0}, 'trials': 2}}}
"""


class Passkey(evaluate.Metric):
    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description=__doc__,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({
                "predictions": datasets.Value("string"),
                "references": datasets.Value("string"),
                "lengths": datasets.Value("int64"),
                "depths": datasets.Value("float64"),
            }),
        )

    def _compute(self, predictions: list[str], references: list[str], lengths: list[int], depths: list[float]) -> dict:
        if not references:
            raise ValueError("passkey needs at least one trial")
        hits: dict[int, dict[float, list[bool]]] = defaultdict(lambda: defaultdict(list))
        for pred, ref, length, depth in zip(predictions, references, lengths, depths):
            hits[length][round(depth, 6)].append(pred.strip().rstrip(".").strip() == ref.strip())
        by_length = {}
        for length in sorted(hits):
            cells = hits[length]
            flat = [h for d in cells.values() for h in d]
            by_length[length] = {
                "accuracy": sum(flat) / len(flat),
                "by_depth": {d: sum(cells[d]) / len(cells[d]) for d in sorted(cells)},
                "trials": len(flat),
            }
        total = sum(v["accuracy"] * v["trials"] for v in by_length.values()) / len(references)
        return {"accuracy": total, "by_length": by_length}
