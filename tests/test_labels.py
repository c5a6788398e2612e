"""Labels that say what was measured, as the new user met them: the baseline of a trained folder is its own weights
with the native scheme (not the original model, which is offered), the scored places beside every perplexity table,
identical series drawn so each is visible, and a model card with the right columns and the weights' provenance."""

from __future__ import annotations

import time
from pathlib import Path

from conftest import tiny_model
from test_train import recipe_dict, tiny_assets, write_recipe

from transformers import AutoTokenizer

import hf_posenc as hp
from hf_posenc.evaluation.suite import registered_tables
from hf_posenc import cli, hub, plots, results


def _ppl(run: results.Run, length: int) -> float:
    return run.metrics["perplexity"][str(length)]["perplexity"]


def test_the_baseline_of_a_patched_folder_is_named_for_what_it_is_and_the_original_scored_beside_it(tmp_path, capsys):
    assets = tiny_assets(tmp_path / "assets", "llama")
    folder = tmp_path / "tiny-alibi"
    assert cli.main(["patch", str(assets["model"]), "alibi", "--out", str(folder)]) == 0
    capsys.readouterr()
    assert cli.main(["eval", "--model", str(folder), "--suite", "ppl", "--lengths", "16,32", "--perplexity.max-windows", "1",
                     "--out", str(tmp_path / "eval")]) == 0
    printed = capsys.readouterr()
    record = results.load(tmp_path / "eval" / "results.json")
    # the patch's marker names its source: that model is loaded, and since a patch changes no weight it is the
    # folder's own weights with RoPE back: one row named for both, scored once (issue 61)
    both = "tiny-alibi (its own weights, rope positions) = model (original model)"
    assert [run.label for run in record.runs] == ["tiny-alibi (as loaded)", both]
    assert _ppl(record.runs[1], 32) != _ppl(record.runs[0], 32)
    assert "not scoring the original" not in printed.err
    assert f"| {both} |" in printed.out
    assert set(record.details["peak_memory_mb"]) == {run.label for run in record.runs}
    # the scored places beside the table: same_target's places depend on the set of lengths
    assert "perplexity scored the same last 8 tokens of 1 windows of kjv" in printed.out
    assert "depends on the set of lengths (16, 32)" in printed.out
    # the model card names every row, the original among them
    assert f"| tiny-alibi (as loaded) | {both} |" in hub.model_card(tmp_path / "eval").text
    assert {path.name for path in (tmp_path / "eval").glob("*.png")} == {"perplexity.png"}


def test_a_trained_folder_is_scored_beside_the_model_it_was_trained_from(tmp_path, capsys):
    assets = tiny_assets(tmp_path / "assets", "llama")
    run = tmp_path / "run"
    recipe = write_recipe(tmp_path / "r.yaml", recipe_dict(assets, run, use_peft=False, max_steps=2,
                                                           learning_rate=1e-2, max_eval_samples=2))
    assert cli.main(["train", str(recipe)]) == 0
    capsys.readouterr()
    assert cli.main(["eval", "--model", str(run), "--suite", "ppl", "--lengths", "16,32", "--perplexity.max-windows", "1",
                     "--out", str(tmp_path / "eval")]) == 0
    record = results.load(tmp_path / "eval" / "results.json")
    labels = [r.label for r in record.runs]
    assert labels == ["run (as loaded)", "run (its own weights, rope positions)", "model (original model)"]
    # trained weights with RoPE put back are not the original model (16.09 against 14.32 for the demo's)
    assert _ppl(record.runs[1], 32) != _ppl(record.runs[2], 32)
    assert "not scoring the original" not in capsys.readouterr().err


def test_an_original_model_out_of_reach_is_said_in_one_line(tmp_path, capsys, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assets = tiny_assets(tmp_path / "assets", "llama")
    folder = tmp_path / "tiny-alibi"
    hp.patch(hp.from_pretrained(str(assets["model"])), "alibi").save_pretrained(folder)  # no record of its source
    AutoTokenizer.from_pretrained(assets["model"]).save_pretrained(folder)
    (folder / "README.md").write_text(str(hub.model_card(folder, "owner/tiny-base")))  # `hf-posenc card`'s card
    capsys.readouterr()
    started = time.monotonic()
    assert cli.main(["eval", "--model", str(folder), "--suite", "ppl", "--lengths", "16,32", "--perplexity.max-windows", "1",
                     "--out", str(tmp_path / "eval")]) == 0
    printed = capsys.readouterr()
    lines = [line for line in printed.err.splitlines() if "original model" in line]
    assert len(lines) == 1 and "owner/tiny-base" in lines[0] and "base_model" in lines[0], printed.err
    assert "HF_HUB_OFFLINE" in lines[0] and time.monotonic() - started < 120  # no Hub retries
    assert [run.label for run in results.load(tmp_path / "eval" / "results.json").runs] == [
        "tiny-alibi (as loaded)", "tiny-alibi (its own weights, rope positions)"]


def test_a_scheme_without_options_is_not_labelled_as_a_call():
    assert results.run_label("smollm2", "alibi", {}) == "smollm2 alibi"
    assert results.run_label("smollm2", "yarn", {"factor": 2.0}) == "smollm2 yarn(factor=2.0)"


def test_identical_series_are_drawn_apart_and_say_so(tmp_path):
    cell = {"accuracy": 1.0, "n": 10, "low": 0.72, "high": 1.0}
    same = {"passkey": {"128": cell, "512": cell}}
    runs = [results.Run("yarn x2", metrics=same), results.Run("original", metrics=same),
            results.Run("alibi", metrics={"passkey": {"128": {**cell, "accuracy": 0.5, "low": 0.24, "high": 0.76}, "512": cell}})]
    drawn = plots.dodged(runs, "passkey", "accuracy")
    assert [label for _, label, _ in drawn] == ["yarn x2", "original (same as yarn x2; shifted)", "alibi"]
    assert drawn[0][0] == drawn[2][0] == 1.0 < drawn[1][0] and drawn[0][2] != drawn[1][2]
    assert (tmp_path / "passkey.png") in plots.results_by_length(runs, registered_tables(), tmp_path)


def test_the_card_of_an_eval_of_the_packaged_model_states_its_provenance_and_scored_places(tmp_path):
    folder = tmp_path / "eval-alibi"
    posenc = {"format": 1, "scheme": "alibi", "options": {}, "from": "rope"}
    cell = {"perplexity": 12.5, "loss": 2.5, "tokens": 63, "windows": 1, "target": 32}
    settings = {"suite": ["perplexity"], "lengths": [64, 128], "text": "kjv", "perplexity_mode": "same_target",
                "target_tokens": 32, "max_windows": 4, "dtype": "float32"}
    record = results.Results("eval", "smollm2", complete=True, settings=settings, format=3, runs=[
        results.Run(results.run_label("smollm2", "alibi", {}), "alibi", {}, posenc, {"perplexity": {"64": cell}}),
        results.Run("smollm2 (unpatched)", metrics={"perplexity": {"64": {**cell, "perplexity": 4.0}}})])
    folder.mkdir()
    record.save(folder / "results.json", complete=True)
    text = hub.model_card(folder).text
    assert "| metric | setting | smollm2 alibi | smollm2 (unpatched) |" in text and "alibi()" not in text
    assert "4-bit GGUF `SmolLM2-135M-Instruct.Q4_1.gguf`" in text and "dequantized to fp32" in text
    assert "\nperplexity scored the same last 32 tokens of 4 windows of kjv" in text


def test_a_card_of_a_model_not_from_a_packaged_gguf_claims_no_provenance(tmp_path):
    folder = tmp_path / "m"
    hp.patch(tiny_model("gpt2"), "rope").save_pretrained(folder)
    assert "GGUF" not in hub.model_card(folder, "openai-community/gpt2").text


def test_compare_states_the_scored_places_and_refuses_files_whose_places_differ(tmp_path, capsys):
    model = tiny_assets(tmp_path / "assets", "llama")["model"]
    paths = {}
    for lengths in ("16,32", "16,48"):
        out = tmp_path / lengths.replace(",", "-")
        assert cli.main(["eval", "--model", str(model), "--suite", "ppl", "--lengths", lengths, "--perplexity.max-windows", "2",
                         "--perplexity.target-tokens", "8", "--out", str(out)]) == 0
        paths[lengths] = str(out / "results.json")
    a, b = (results.load(path).runs[0].metrics["perplexity"]["16"] for path in paths.values())
    assert a["perplexity"] != b["perplexity"]  # the same model, length, windows and target: other places
    capsys.readouterr()
    assert cli.main(["eval", "--compare", *paths.values(), "--out", str(tmp_path / "refused")]) == 2
    assert "longest_length differ" in capsys.readouterr().err and not (tmp_path / "refused").exists()
    assert cli.main(["eval", "--compare", *paths.values(), "--mixed", "--out", str(tmp_path / "mixed")]) == 0
    table = (tmp_path / "mixed" / "compare.md").read_text()
    assert "Notes:\n- perplexity scored the same last 8 tokens" in table
    assert "set of lengths (16, 32)" in table and "set of lengths (16, 48)" in table
    assert f"[1] {paths['16,32']}: perplexity.longest_length=32" in table
    assert cli.main(["eval", "--compare", paths["16,32"], "--out", str(tmp_path / "one")]) == 0
    assert (tmp_path / "one" / "compare.md").read_text().count("- perplexity scored") == 1
