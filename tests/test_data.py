"""Offline data sources: KJV long text, the Rotten Tomatoes sentiment set, synthetic tasks."""

from __future__ import annotations

import datasets
import pytest

from hf_posenc import data
from hf_posenc.errors import PosEncError


def test_kjv_is_one_long_document_of_books():
    text = data.long_text("kjv")
    assert text.startswith("Genesis\n\nIn the beginning God created the heaven and the earth.")
    assert len(text.split()) > 750_000  # ASSETS.md: ~790k words
    assert "\n\nRevelation\n\n" in text and text.rstrip().endswith("Amen.")


def test_long_text_from_a_dataset_object_and_its_errors():
    rows = datasets.Dataset.from_dict({"body": ["first doc", "", "second doc"]})
    assert data.long_text(rows, text_column="body") == "first doc\n\nsecond doc"
    with pytest.raises(PosEncError, match=r"no column 'text'.*\['body'\].*text_column="):
        data.long_text(rows)
    with pytest.raises(PosEncError, match="no split 'test'"):
        data.long_text(datasets.DatasetDict({"train": rows}), text_column="body")


def test_unreachable_hub_dataset_points_to_the_offline_default():
    with pytest.raises(PosEncError, match="name='kjv'"):
        data.long_text("no-such-user/no-such-dataset-xyz")


def test_sentiment_dataset_has_a_fixed_disjoint_split():
    first = data.sentiment_dataset()
    assert {k: len(v) for k, v in first.items()} == {"train": 8454, "validation": 1057, "test": 1057}
    assert first["train"].features["label"].names == ["negative", "positive"]
    texts = {k: set(v["text"]) for k, v in first.items()}
    assert not (texts["train"] & texts["test"]) and not (texts["validation"] & texts["test"])
    positives = sum(sum(v["label"]) for v in first.values())
    assert positives == 5242  # ASSETS.md: 5,242 positive / 5,326 negative, neutral dropped
    again = data.sentiment_dataset()  # loaded from the cache, same rows
    assert again["test"]["text"] == first["test"]["text"]
    assert (data.cache_dir() / "sentiment_rt_vader_seed0" / "dataset_dict.json").is_file()


def test_sentiment_dataset_from_a_wrong_file_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_POSENC_CACHE", str(tmp_path))
    with pytest.raises(PosEncError, match="pass source="):
        data.sentiment_dataset(source=tmp_path / "missing.tar.gz")


@pytest.mark.parametrize("task", data.SYNTHETIC_TASKS)
def test_synthetic_tasks_have_correct_answers(task):
    rows = data.synthetic_task(task, 5, 20, seed=3)
    assert rows["length"] == [5] * 20 and len(set(rows["prompt"])) > 15
    for prompt, target in zip(rows["prompt"], rows["target"]):
        assert target.startswith(" ") and prompt.endswith(" =")
        if task == "addition":
            a, b = prompt[:-2].split(" + ")
            assert len(a) == len(b) == 5 and int(target) == int(a) + int(b)
        else:
            digits = prompt[len(task) + 1 : -2].split()
            assert len(digits) == 5
            assert target.split() == (digits if task == "copy" else digits[::-1])
    assert data.synthetic_task(task, 5, 20, seed=3)["prompt"] == rows["prompt"]  # reproducible


def test_length_generalization_splits_train_short_test_long():
    splits = data.length_generalization_splits("copy", [1, 2, 3], [6, 8], n_train=4, n_test=2)
    assert sorted(set(splits["train"]["length"])) == [1, 2, 3] and len(splits["train"]) == 12
    assert sorted(set(splits["test"]["length"])) == [6, 8] and len(splits["test"]) == 4
    with pytest.raises(PosEncError, match="overlap at \\[3\\]"):
        data.length_generalization_splits("copy", [2, 3], [3, 4], 1, 1)
    with pytest.raises(PosEncError, match="unknown task 'sort'"):
        data.synthetic_task("sort", 3, 1)
    with pytest.raises(PosEncError, match="positive"):
        data.synthetic_task("copy", 0, 1)
