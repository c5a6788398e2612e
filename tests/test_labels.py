"""Labels that say what was measured, as the new user met them: the baseline of a trained folder is its own weights
with the native scheme (not the original model, which is offered), the scored places beside every perplexity table,
identical series drawn so each is visible, and a model card with the right columns and the weights' provenance."""

from __future__ import annotations

from pathlib import Path

from conftest import tiny_model
from test_train import tiny_assets

import hf_posenc as hp
from hf_posenc import cli, hub, plots, results


def test_the_baseline_of_a_patched_folder_is_named_for_what_it_is_and_the_original_is_offered(tmp_path, capsys):
    assets = tiny_assets(tmp_path / "assets", "llama")
    folder = tmp_path / "tiny-alibi"
    assert cli.main(["patch", str(assets["model"]), "alibi", "--out", str(folder)]) == 0
    (folder / "README.md").write_text(str(hub.model_card(folder, "owner/tiny-base")))  # `hf-posenc card`'s card
    capsys.readouterr()
    assert cli.main(["eval", "--model", str(folder), "--suite", "ppl", "--lengths", "16,32", "--max-windows", "1",
                     "--out", str(tmp_path / "eval")]) == 0
    printed = capsys.readouterr().out
    record = results.load(tmp_path / "eval" / "results.json")
    assert [run.label for run in record.runs] == ["tiny-alibi (as loaded)", "tiny-alibi (its own weights, rope positions)"]
    assert "not the original model" in printed and "--model owner/tiny-base" in printed
    # the scored places beside the table: same_target's places depend on the set of lengths
    assert "perplexity scored the same last 8 tokens of 1 windows of kjv" in printed
    assert "depends on the set of lengths (16, 32)" in printed


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
    assert (tmp_path / "passkey.png") in plots.results_by_length(runs, tmp_path)


def test_the_card_of_an_eval_of_the_packaged_model_states_its_provenance_and_scored_places(tmp_path):
    folder = tmp_path / "eval-alibi"
    posenc = {"format": 1, "scheme": "alibi", "options": {}, "from": "rope"}
    cell = {"perplexity": 12.5, "loss": 2.5, "tokens": 63, "windows": 1, "target": 32}
    settings = {"suite": ["perplexity"], "lengths": [64, 128], "text": "kjv", "perplexity_mode": "same_target",
                "target_tokens": 32, "max_windows": 4, "dtype": "float32"}
    record = results.Results("eval", "smollm2", complete=True, settings=settings, runs=[
        results.Run(results.run_label("smollm2", "alibi", {}), "alibi", {}, posenc, {"perplexity": {"64": cell}}),
        results.Run("smollm2 (unpatched)", metrics={"perplexity": {"64": {**cell, "perplexity": 4.0}}})])
    folder.mkdir()
    record.save(folder / "results.json", complete=True)
    text = hub.model_card(folder).text
    assert "| metric | setting | smollm2 alibi | smollm2 (unpatched) |" in text and "alibi()" not in text
    assert "4-bit GGUF `SmolLM2-135M-Instruct.Q4_1.gguf`" in text and "dequantized to fp32" in text
    assert "Scored places: perplexity scored the same last 32 tokens of 4 windows of kjv" in text


def test_a_card_of_a_model_not_from_a_packaged_gguf_claims_no_provenance(tmp_path):
    folder = tmp_path / "m"
    hp.patch(tiny_model("gpt2"), "rope").save_pretrained(folder)
    assert "GGUF" not in hub.model_card(folder, "openai-community/gpt2").text
