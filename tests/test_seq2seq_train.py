"""Encoder-decoders in recipes (model.task seq2seq) and the seq2seq length-generalisation suites.

Tiny T5 and BART trained from scratch (`hf_posenc.tiny_seq2seq`) by the recipe runner, in this process;
the loss checks use the peaky random models of tests/seq2seq_models.py, so a wrong decoder input shows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from seq2seq_models import tiny_seq2seq
from test_train import recipe_dict, tiny_assets, write_recipe

import hf_posenc
from hf_posenc import cli, results
from hf_posenc.data import seq2seq_pairs
from hf_posenc.errors import PosEncError
from hf_posenc.evaluation import SuiteSettings, run_suites, seq2seq_length_generalization
from hf_posenc.loading import load, load_tokenizer
from hf_posenc.stats import wilson
from hf_posenc.tiny_seq2seq import digit_tokenizer, write_task
from hf_posenc.train import inputs, load_recipe, preflight, tasks, train

pytestmark = pytest.mark.xdist_group("seq2seq_train")  # one worker builds the module fixture

SCHEME = {"t5": "rope", "bart": "alibi"}  # a swapped scheme per family: the reload must re-apply it


def s2s_recipe(assets: dict[str, Path], out: Path, **fields: Any) -> dict:
    return {"model_name_or_path": str(assets["model"]), "task": "seq2seq", "use_peft": False,
            "dataset_name": str(assets["data"]), "text_column": "input", "target_column": "target", "seq_len": 32,
            "max_eval_samples": 32, "max_steps": 40, "global_batch_size": 16, "per_device_train_batch_size": 16,
            "learning_rate": 3e-3, "warmup_steps": 2, "lr_scheduler_type": "cosine", "seed": 0, "logging_steps": 1,
            "save_strategy": "no", "per_device_eval_batch_size": 32, "output_dir": str(out), "plot": False, **fields}


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, dict]:
    """Per family: its assets, recipe and run folder, trained 40 steps on copy at 1..4 digits."""
    root = tmp_path_factory.mktemp("s2s")
    runs = {}
    for model_type, scheme in SCHEME.items():
        assets = write_task(root / model_type, model_type, "copy", range(1, 5), n_train=1024, n_eval=32)
        path = write_recipe(root / f"{model_type}.yaml", s2s_recipe(assets, root / f"{model_type}-run",
                                                                     scheme=scheme))
        recipe = load_recipe(path)
        runs[model_type] = {"assets": assets, "recipe": recipe, "out": root / f"{model_type}-run",
                            "record": train(recipe)}
    return runs


@pytest.mark.parametrize("model_type", list(SCHEME))
def test_recipe_trains_and_the_saved_folder_reloads_identically(trained, model_type):
    run = trained[model_type]
    record, recipe = run["record"], run["recipe"]
    before, after = (record.run(label).metrics["seq2seq"][str(run["assets"]["data"])]
                     for label in ("before training", "after training"))
    assert after["loss"] < 0.7 * before["loss"], (before, after)  # 40 steps from scratch
    assert after["n"] == 32 and after["low"] <= after["exact_match"] <= after["high"]
    assert record.run("after training").posenc["scheme"] == SCHEME[model_type]
    saved = results.load(run["out"] / "results.json")
    assert saved.run("after training").metrics == record.run("after training").metrics

    model = hf_posenc.from_pretrained(run["out"], model_cls=transformers.AutoModelForSeq2SeqLM).eval()
    assert type(model).__name__.lower().startswith(model_type) and hf_posenc.describe(model).scheme == SCHEME[model_type]
    tokenizer = load_tokenizer(str(run["out"]))
    data = tasks.prepare(recipe, inputs.load_raw(recipe), tokenizer)
    batch = data.collate([data.eval[i] for i in range(len(data.eval))])
    with torch.no_grad():
        scores = tasks.TRAINING_TASKS["seq2seq"].scores(model(**batch).logits, batch["labels"])
    plain = transformers.AutoModelForSeq2SeqLM.from_pretrained(run["out"], trust_remote_code=True).eval()
    with torch.no_grad():  # the folder also loads without hf-posenc's loader, to the same logits
        torch.testing.assert_close(plain(**batch).logits, model(**batch).logits, rtol=0, atol=0)
    # the reloaded model scores the held-out rows as the trained one did at the end of the run
    assert scores["loss_sum"].sum().item() / scores["tokens"].sum().item() == pytest.approx(after["loss"], rel=1e-5)
    hits = int(scores["exact"].sum().item())
    assert hits == round(after["exact_match"] * 32)
    # teacher-forced exact match (the run's) == greedy generation's exact match (the eval suite's)
    eval_rows = inputs.row_splits(recipe, inputs.load_raw(recipe))[1]
    generated = seq2seq_length_generalization(model, tokenizer, eval_rows, batch_size=1)
    assert round(generated["exact_match"] * 32) == hits


@pytest.mark.parametrize("model_type", ["t5", "bart"])
def test_labels_go_through_the_decoder(tmp_path, model_type):
    """The run's loss is the model's own loss on labels, which is cross-entropy of the decoder fed the labels
    shifted right (decoder start token first, -100 read as pad), computed here by hand."""
    model = tiny_seq2seq(model_type)
    config = model.config
    rows = [{"input_ids": ids, "attention_mask": [1] * len(ids), "labels": labels}
            for ids, labels in (([5, 9, 14, 2], [7, 8, 2]), ([30, 31, 2], [40, 41, 42, 43, 2]))]
    # the run's collator (`inputs.prepare_seq2seq`): labels padded with IGNORE_INDEX
    batch = transformers.DataCollatorForSeq2Seq(digit_tokenizer(), label_pad_token_id=inputs.IGNORE_INDEX)(rows)
    assert batch["labels"][0, 3:].tolist() == [inputs.IGNORE_INDEX] * 2 and batch["attention_mask"][1, 3].item() == 0
    with torch.no_grad():  # the task scores the logits Trainer's evaluation gets from the model fed the labels
        scores = tasks.TRAINING_TASKS["seq2seq"].scores(model(**batch).logits, batch["labels"])
    ours = scores["loss_sum"].sum() / scores["tokens"].sum()
    labels = batch["labels"]
    decoder_in = torch.cat([torch.full((2, 1), config.decoder_start_token_id), labels[:, :-1]], dim=1)
    decoder_in = decoder_in.masked_fill(decoder_in == inputs.IGNORE_INDEX, config.pad_token_id)
    with torch.no_grad():
        own = model(**batch).loss
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       decoder_input_ids=decoder_in).logits
        wrong = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                      decoder_input_ids=labels.clamp(min=0)).logits  # unshifted: what a bug would feed
    log_p = torch.log_softmax(logits.float(), -1)
    picked = [-log_p[b, t, labels[b, t]] for b in range(2) for t in range(labels.shape[1]) if labels[b, t] >= 0]
    by_hand = torch.stack(picked).mean()
    torch.testing.assert_close(ours, by_hand, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(own, by_hand, rtol=1e-5, atol=1e-6)
    assert scores["tokens"].tolist() == [3.0, 5.0]
    assert (logits - wrong).abs().max() > 1.0  # the peaky model tells the two decoder inputs apart


# --- bad fields: each a named PosEncError before any weights load ---

@pytest.mark.parametrize("fields, pieces", [
    ({"pose": {"target_length": 128}}, ["pose", "causal LMs"]),
    ({"objective": "distill"}, ["objective", "'distill'", "'seq2seq' takes 'lm' only"]),
    ({"task": "seq2seq_lm"}, ["task", "'causal_lm', 'classification', 'seq2seq'"]),
    ({"target_colum": "y"}, ["'target_colum'", "did you mean 'target_column'"]),
    ({"eval_every_steps": 10}, ["eval_every_steps", "causal LMs", "'seq2seq'"]),
    ({"perplexity_lengths": [64]}, ["perplexity_lengths", "causal LMs"]),
])
def test_recipe_errors_are_named(tmp_path, fields, pieces):
    assets = {"model": tmp_path / "m", "data": tmp_path / "d"}
    path = write_recipe(tmp_path / "bad.yaml", s2s_recipe(assets, tmp_path / "out", **fields))
    with pytest.raises(PosEncError) as err:
        load_recipe(path)
    for piece in [str(path), *pieces]:
        assert piece in str(err.value), str(err.value)


def test_wrong_model_kind_or_column_refused_before_weights_load(tmp_path, loads):
    causal = tiny_assets(tmp_path / "llama")
    recipe = load_recipe(write_recipe(tmp_path / "c.yaml", s2s_recipe(causal, tmp_path / "o1")))
    with pytest.raises(PosEncError, match=r"task: 'seq2seq' trains encoder-decoder models .* is a 'llama' model"):
        preflight(recipe, False, False, 1)
    pair = write_task(tmp_path / "t5", "t5", "copy", [1, 2], n_train=8, n_eval=4)
    lm = recipe_dict(pair, tmp_path / "o2")
    with pytest.raises(PosEncError, match=r"task: 'causal_lm' trains decoder-only models; .* 't5' encoder-decoder"):
        preflight(load_recipe(write_recipe(tmp_path / "l.yaml", lm)), False, False, 1)
    column = s2s_recipe(pair, tmp_path / "o3", target_column="answer")
    with pytest.raises(PosEncError, match=r"target_column: column 'answer' not in .* columns: input, target, length"):
        preflight(load_recipe(write_recipe(tmp_path / "t.yaml", column)), False, False, 1)
    unsupported = s2s_recipe(pair, tmp_path / "o4", scheme="self_extend")
    with pytest.raises(PosEncError, match=r"scheme: 't5' does not support 'self_extend'; supported: .*rope"):
        preflight(load_recipe(write_recipe(tmp_path / "u.yaml", unsupported)), False, False, 1)
    assert loads == [] and not any((tmp_path / f"o{i}").exists() for i in range(1, 5))


# --- the eval suites ---

@pytest.mark.parametrize("task", ["copy", "reverse", "addition"])
def test_pairs_have_the_requested_lengths(task):
    pairs = seq2seq_pairs(task, 7, 5, seed=3)
    assert pairs["length"] == [7] * 5 and len(set(pairs["input"])) == 5
    for source, target in zip(pairs["input"], pairs["target"]):
        if task == "addition":
            a, b = source.split(" + ")
            assert len(a) == len(b) == 7 and int(target) == int(a) + int(b)
        else:
            digits = source.split()
            assert len(digits) == 7 and target.split() == (digits if task == "copy" else digits[::-1])
    ids = digit_tokenizer()(pairs["input"][0])["input_ids"]
    assert len(ids) == (16 if task == "addition" else 8)  # one token per digit (and "+"), then </s>


def test_exact_match_equals_a_hand_count_of_generated_outputs(trained, tmp_path):
    folder = str(trained["t5"]["out"])
    model, tokenizer = load(folder, task="seq2seq")
    record = run_suites(model, tokenizer, SuiteSettings(["seq2seq_copy"], [8], synthetic={"task_lengths": [2, 4, 8], "examples": 12}),
                        tmp_path / "ev")
    cells = record.runs[0].metrics["seq2seq_copy"]
    for length in (2, 4, 8):
        pairs = seq2seq_pairs("copy", length, 12, seed=0)
        hits = 0
        for source, target in zip(pairs["input"], pairs["target"]):  # one pair at a time, no padding
            ids = model.generate(**tokenizer(source, return_tensors="pt"), max_new_tokens=length + 2, do_sample=False)
            hits += tokenizer.decode(ids[0], skip_special_tokens=True).split() == target.split()
        cell = cells[str(length)]
        assert cell["exact_match"] == hits / 12 and cell["n"] == 12
        assert (cell["low"], cell["high"]) == pytest.approx(wilson(hits, 12))
    assert cells["2"]["exact_match"] > 0  # trained 40 steps at 1..4 digits: the hand count is not 0 == 0
    with pytest.raises(PosEncError, match="is not an encoder-decoder model: the suites seq2seq_copy need one"):
        run_suites(tiny_assets_model(tmp_path), tokenizer, SuiteSettings(["seq2seq_copy"], [8]), tmp_path / "no")
    with pytest.raises(PosEncError, match="is an encoder-decoder model: it takes the suites .* not copy"):
        run_suites(model, tokenizer, SuiteSettings(["copy"], [8]), tmp_path / "no2")
    assert not (tmp_path / "no").exists() and not (tmp_path / "no2").exists()


def tiny_assets_model(tmp_path: Path) -> torch.nn.Module:
    return load(str(tiny_assets(tmp_path / "llama")["model"]))[0]


def test_cli_eval_on_a_saved_seq2seq_folder(trained, tmp_path, capsys):
    folder = str(trained["bart"]["out"])
    out = tmp_path / "ev"
    assert cli.main(["eval", "--model", folder, "--suite", "seq2seq_copy", "--synthetic.task-lengths", "2,8", "--synthetic.examples", "6",
                     "--out", str(out), "--no-baseline"]) == 0
    record = results.load(out / "results.json")
    assert record.complete and record.settings["suite"] == ["seq2seq_copy"]
    cells = record.runs[0].metrics["seq2seq_copy"]
    assert set(cells) == {"2", "8"} and all(c["n"] == 6 and c["low"] <= c["exact_match"] <= c["high"] for c in cells.values())
    assert "seq2seq_copy exact match @ 2 digits" in capsys.readouterr().out
    assert cli.main(["card", folder]) == 0  # the run's seq2seq table goes into the model card's model-index
    card = (Path(folder) / "README.md").read_text()
    assert "text2text-generation" in card and "seq2seq exact match" in card
    assert cli.main(["eval", "--model", folder, "--suite", "ppl", "--out", str(tmp_path / "x")]) == 2
    assert "(bart) is an encoder-decoder model: it takes the suites seq2seq_copy" in capsys.readouterr().err
    causal = str(tiny_assets(tmp_path / "llama")["model"])
    assert cli.main(["eval", "--model", causal, "--suite", "seq2seq_reverse", "--out", str(tmp_path / "y")]) == 2
    assert "(llama) is not an encoder-decoder model: the suites seq2seq_reverse need one" in capsys.readouterr().err
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_cli_patches_a_stock_seq2seq_folder(trained, tmp_path, capsys):
    """`--patch` / `patch` on an encoder-decoder folder: its scheme support and options are checked on both
    stacks (a meta-device instance of the config), then the model is patched; a bad option writes nothing."""
    stock = str(trained["t5"]["assets"]["model"])
    out = tmp_path / "ev"
    assert cli.main(["eval", "--model", stock, "--patch", "alibi", "--suite", "seq2seq_copy", "--synthetic.task-lengths", "2",
                     "--synthetic.examples", "4", "--out", str(out), "--no-baseline"]) == 0
    run = results.load(out / "results.json").runs[0]
    assert run.posenc["scheme"] == "alibi" and run.posenc["stacks"] == ["encoder", "decoder"]
    assert cli.main(["patch", stock, "kerple", "--out", str(tmp_path / "k")]) == 0
    model = hf_posenc.from_pretrained(str(tmp_path / "k"), model_cls=transformers.AutoModelForSeq2SeqLM)
    assert hf_posenc.describe(model).scheme == "kerple"
    assert cli.main(["patch", stock, "concat", "--opt", "d_pos=1000", "--out", str(tmp_path / "bad")]) == 2
    assert "'concat': d_pos must be < the hidden size 128, got 1000" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()
