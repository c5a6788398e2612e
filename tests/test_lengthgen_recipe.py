"""Issue 47: the length-generalisation tasks as training data of the recipe runner. `tiny_decoder.write_task`
writes a tiny GPT-2 and one task's prompt -> completion rows; a shipped `recipes/lengthgen` recipe trains it from
scratch with any scheme (`task: prompt_completion`: the loss on the completion only), and its held-out exact match
(teacher-forced) is greedy generation's."""

from __future__ import annotations

from pathlib import Path

import datasets
import pytest
import torch

import hf_posenc as hp
from hf_posenc import results
from hf_posenc.errors import PosEncError
from hf_posenc.evaluation.lengthgen import scoring
from hf_posenc.evaluation.lengthgen.tasks import Example
from hf_posenc.loading import load
from hf_posenc.tiny_decoder import tiny_model, write_task
from hf_posenc.train import inputs, load_recipe, tasks, train

RECIPES = Path(__file__).resolve().parents[1] / "recipes" / "lengthgen" / "repeat"


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict[str, Path]:
    return write_task(tmp_path_factory.mktemp("lengthgen"), "repeat", range(1, 7), longest=12, n_train=1200,
                      n_eval=60)


def recipe_of(name: str, written: dict[str, Path], out: Path, *more: str):
    return load_recipe(RECIPES / f"config_{name}.yaml", ["--model_name_or_path", str(written["model"]),
                                                        "--dataset_name", str(written["data"]),
                                                        "--output_dir", str(out), *more])


def test_rows_label_the_completion_only(written, tmp_path):
    """The rows hf-posenc tokenizes (prompt and completion apart, joined), as TRL's SFTTrainer prepares them for the
    run: labels on the completion only (`completion_only_loss`), padding never a target."""
    from trl import SFTTrainer

    from hf_posenc.train.runner import _arguments

    recipe = recipe_of("nope", written, tmp_path / "out")
    model, tokenizer = load(str(written["model"]))
    raw = inputs.load_raw(recipe)
    data = tasks.prepare(recipe, raw, tokenizer)
    trainer = SFTTrainer(model=model, args=_arguments(recipe, tmp_path / "out", 1, cpu=True), train_dataset=data.train,
                         eval_dataset=data.eval, processing_class=tokenizer)
    rows = [trainer.eval_dataset[i] for i in range(len(trainer.eval_dataset))]
    for row, source in zip(rows[:5], raw["validation"]):
        prompt = tokenizer(source["prompt"])["input_ids"]
        answer = tokenizer(source["completion"], add_special_tokens=False)["input_ids"]
        assert row["input_ids"] == prompt + answer
        assert row["labels"] == [-100] * len(prompt) + answer
    batch = trainer.data_collator(rows)
    assert (batch["attention_mask"] == 0).any() and (batch["labels"][batch["attention_mask"] == 0] == -100).all()


@pytest.mark.parametrize("name", ["nope", "rope_partial"])
def test_a_shipped_recipe_trains_the_tiny_decoder_and_its_exact_match_is_greedy_generations(written, tmp_path, name):
    out = tmp_path / name
    record = train(recipe_of(name, written, out, "--max_steps", "120", "--warmup_steps", "10"))
    before, after = (record.run(label).metrics["completion"][str(written["data"])]
                     for label in ("before training", "after training"))
    assert after["n"] == 60 and after["loss"] < before["loss"]
    assert after["exact_match"] > 0.5, after  # 120 steps fit repeat on 1..6 symbols
    model, tokenizer = hp.from_pretrained(out), load(str(out))[1]
    assert hp.describe(model).scheme == ("nope" if name == "nope" else "rope")
    rows = results.load(out / "results.json")  # the saved folder and the table agree
    assert rows.run("after training").metrics["completion"][str(written["data"])]["exact_match"] == after["exact_match"]
    held_out = datasets.load_from_disk(str(written["data"]))["validation"]
    examples = [Example(r["prompt"], r["completion"], r["prompt"].count(" ")) for r in held_out]
    greedy = scoring.pooled(scoring.score(model.eval(), tokenizer, examples, batch_size=16))
    assert greedy["exact_match"] == after["exact_match"]


def test_bad_task_settings_are_refused_before_anything_is_written(tmp_path):
    for kwargs, match in [({"task": "sorting"}, "sorting"), ({"train_lengths": [0, 1]}, "positive"),
                          ({"longest": 3}, "at least the longest train length")]:
        args = {"task": "repeat", "train_lengths": [1, 2, 4], "longest": 8, **kwargs}
        with pytest.raises(PosEncError, match=match):
            write_task(tmp_path / "w", args.pop("task"), args.pop("train_lengths"), **args)
        assert not (tmp_path / "w").exists()


def test_the_tiny_decoder_takes_the_studys_shape_and_names_a_field_it_does_not_know():
    model = tiny_model(40, seed=3, positions=96, n_embd=32, n_layer=1, n_head=2)
    assert (model.config.n_positions, model.config.n_embd, model.config.n_layer) == (96, 32, 1)
    assert model.config.activation_function == "gelu" and model.config.attn_pdrop == 0.0  # the rest stays SHAPE's
    again = tiny_model(40, seed=3, positions=96, n_embd=32, n_layer=1, n_head=2)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters()))  # one seed, one draw
    with pytest.raises(PosEncError, match=r"unknown tiny decoder field\(s\) \['n_layers'\]; allowed: .*n_layer"):
        tiny_model(40, n_layers=3)
