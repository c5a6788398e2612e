"""The evaluate modules in hf_posenc/metrics load offline with evaluate.load(path) and score correctly."""

from __future__ import annotations

import math

import evaluate
import pytest
import torch
from conftest import tiny_model
from sklearn.metrics import f1_score

from hf_posenc import evaluation

METRICS = sorted(p.name for p in evaluation.METRICS_DIR.iterdir() if (p / f"{p.name}.py").is_file())


def load(name: str) -> evaluate.EvaluationModule:
    return evaluate.load(str(evaluation.METRICS_DIR / name))


def test_every_metric_folder_loads_offline():
    assert {"accuracy", "f1", "passkey", "length_generalization", "perplexity_by_length"} <= set(METRICS)
    for name in METRICS:
        module = load(name)
        assert isinstance(module, evaluate.EvaluationModule) and module.name == name


def test_accuracy_and_f1_match_a_hand_computation():
    preds, refs = [1, 0, 1, 1, 0, 1], [1, 0, 0, 1, 1, 1]
    assert load("accuracy").compute(predictions=preds, references=refs) == {"accuracy": 4 / 6}
    # precision 3/4, recall 3/4 -> F1 0.75
    assert load("f1").compute(predictions=preds, references=refs)["f1"] == pytest.approx(0.75)
    macro = load("f1").compute(predictions=preds, references=refs, average="macro")["f1"]
    assert macro == pytest.approx(f1_score(refs, preds, average="macro"))
    combined = evaluate.combine([load("accuracy"), load("f1")]).compute(predictions=preds, references=refs)
    assert combined == pytest.approx({"accuracy": 4 / 6, "f1": 0.75})


def test_passkey_metric_by_length_and_depth():
    result = load("passkey").compute(
        predictions=["123", " 9.", "77", "5"], references=["123", "9", "78", "5"],
        lengths=[1024, 1024, 2048, 2048], depths=[0.0, 1.0, 0.0, 0.0],
    )
    assert result["accuracy"] == 0.75
    assert result["by_length"][1024] == {"accuracy": 1.0, "by_depth": {0.0: 1.0, 1.0: 1.0}, "trials": 2}
    assert result["by_length"][2048]["by_depth"] == {0.0: 0.5}


def test_length_generalization_metric_is_exact_match_by_length():
    result = load("length_generalization").compute(
        predictions=[" 1 2", "2 1", " 3 4 5", "5 4 4"], references=[" 1 2", " 2 1", " 3 4 5", " 5 4 3"],
        lengths=[2, 2, 3, 3],
    )
    assert result == {"exact_match": 0.75, "by_length": {2: 1.0, 3: 0.5}}


def test_perplexity_module_pools_documents_by_tokens():
    model = tiny_model("llama")
    torch.manual_seed(1)
    docs = [torch.randint(0, 128, (100,)), torch.randint(0, 128, (40,))]
    per_doc = [evaluation.perplexity_by_length(model, d, [16, 64], stride=8, max_windows=3, mode="sliding")
               for d in docs]
    cells = [(length, cell) for doc in per_doc for length, cell in doc.items()]
    result = load("perplexity_by_length").compute(
        lengths=[length for length, _ in cells], losses=[c.get("loss", 0.0) for _, c in cells],
        tokens=[c.get("tokens", 0) for _, c in cells], windows=[c.get("windows", 0) for _, c in cells],
    )["by_length"]
    nll = sum(p[16]["loss"] * p[16]["tokens"] for p in per_doc)
    tokens = sum(p[16]["tokens"] for p in per_doc)
    assert result[16]["tokens"] == tokens and result[16]["perplexity"] == pytest.approx(math.exp(nll / tokens))
    assert result[16]["windows"] == per_doc[0][16]["windows"] + per_doc[1][16]["windows"] == 6
    # the 40-token document is too short for 64: only the first one counts
    assert "skipped" in per_doc[1][64]
    assert result[64]["tokens"] == per_doc[0][64]["tokens"]
    assert result[64]["loss"] == pytest.approx(per_doc[0][64]["loss"])
    alone = load("perplexity_by_length").compute(lengths=[64], losses=[0.0], tokens=[0], windows=[0])["by_length"]
    assert "skipped" in alone[64]


def test_unknown_metric_names_the_shipped_ones():
    from hf_posenc.errors import PosEncError

    with pytest.raises(PosEncError, match="accuracy, f1"):
        evaluation.load_metric("bleu")
