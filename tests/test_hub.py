"""Publishing (reloading saved folders is tests/test_saving.py): the exported repo keeps the remote code, the card
carries model-index metadata from real results files, and a push that cannot reach the Hub leaves
the local folder exactly as it was. The Hub is unreachable here: everything up to the network call
is tested with the real huggingface_hub, whose offline mode makes that call fail fast."""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path

import huggingface_hub
import pytest
import torch
import transformers
from conftest import tiny_model
from huggingface_hub import ModelCard

import hf_posenc as hp
from hf_posenc import cli, hub, plots, results, writing
from hf_posenc.errors import PosEncError
from hf_posenc.evaluation import older

def _output(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = model(ids)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def _snapshot(folder: Path) -> dict[str, str]:
    """Every file under `folder` with the hash of its bytes: what 'unchanged' means."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _eval_results(model: str, posenc: dict | None) -> results.Results:
    """Results as `hf-posenc eval` writes them (schema in hf_posenc/results.py)."""
    run = results.Run("tiny rope()", "rope", {}, posenc, metrics={
        "perplexity": {"64": {"perplexity": 17.25, "loss": 2.85, "tokens": 63, "windows": 1, "stride": 64},
                       "128": {"skipped": "IndexError: index out of range"}},
        "passkey": {"64": {"accuracy": 0.5, "by_depth": {"0.0": 1.0, "1.0": 0.0}, "trials": 2, "tokens": 60}},
        "classification": {"rotten_tomatoes": {"accuracy": 0.625, "f1": 0.6, "examples": 40, "mode": "zero-shot"}},
        "copy": {"2": {"exact_match": 1.0}, "4": {"exact_match": 0.25}},
    })
    record = results.Results("eval", model, runs=[run], complete=True, settings={
        "suite": ["perplexity", "passkey", "rotten_tomatoes", "copy"], "lengths": [64, 128], "text": "kjv"})
    record.suites = older.described(record)  # the sections the suites write (run_suites)
    return record


@pytest.fixture
def saved(tmp_path: Path) -> tuple[Path, torch.nn.Module]:
    """A tiny GPT-2 patched to rope, saved with an eval results file, its plots and a training checkpoint."""
    model = hp.patch(tiny_model("gpt2"), "rope", theta=500.0)
    folder = tmp_path / "gpt2-rope"
    model.save_pretrained(folder)
    record = _eval_results("openai-community/gpt2", hp.describe(model).to_dict())
    (folder / "eval").mkdir()
    record.save(folder / "eval" / "results.json", complete=True)
    assert plots.results_by_length(record.runs, record.tables(), folder / "eval")
    (folder / "checkpoints" / "step-2").mkdir(parents=True)
    (folder / "checkpoints" / "step-2" / "optimizer.bin").write_bytes(b"\0" * 64)
    return folder, model


def test_export_stages_card_code_and_config_without_touching_the_folder(tmp_path, saved):
    folder, model = saved
    before = _snapshot(folder)
    repo = hub.export(folder, tmp_path / "staged", base_model="openai-community/gpt2", repo_id="me/gpt2-rope")
    assert _snapshot(folder) == before

    files = set(_snapshot(repo))
    assert {"config.json", "model.safetensors", "modeling_posenc.py", "README.md", "eval/results.json",
            "eval/perplexity.png", "eval/passkey.png"} <= files
    assert not any(f.startswith("checkpoints/") for f in files)
    assert (repo / "modeling_posenc.py").read_text() == writing.remote_code()
    config, original = (json.loads(p.read_text()) for p in (repo / "config.json", folder / "config.json"))
    assert config == original and config["auto_map"]["AutoModelForCausalLM"] == "modeling_posenc.PosEncForCausalLM"
    assert (repo / "model.safetensors").stat().st_ino != (folder / "model.safetensors").stat().st_ino  # a copy
    linked = hub.export(folder, tmp_path / "linked", link=True)  # push's private staging
    assert (linked / "model.safetensors").stat().st_ino == (folder / "model.safetensors").stat().st_ino
    assert (linked / "config.json").stat().st_ino != (folder / "config.json").stat().st_ino
    assert _snapshot(folder) == before

    card = ModelCard.load(repo / "README.md")
    assert card.data.base_model == "openai-community/gpt2" and card.data.pipeline_tag == "text-generation"
    assert "posenc-rope" in card.data.tags and card.data.model_name == "gpt2-rope"
    metrics = {(r.dataset_type, r.metric_type, r.metric_name): r.metric_value for r in card.data.eval_results}
    assert metrics == {
        ("kjv", "perplexity", "perplexity @ 64 tokens"): 17.25,  # the skipped 128 is in the text, not the index
        ("passkey", "accuracy", "passkey accuracy @ 64 tokens"): 0.5,
        ("rotten_tomatoes", "accuracy", "classification accuracy @ rotten_tomatoes"): 0.625,
        ("rotten_tomatoes", "f1", "classification f1 @ rotten_tomatoes"): 0.6,
        ("synthetic-copy", "exact_match", "copy exact match @ 2 digits"): 1.0,
        ("synthetic-copy", "exact_match", "copy exact match @ 4 digits"): 0.25,
    }
    by_name = {r.metric_name: r for r in card.data.eval_results}
    assert by_name["classification f1 @ rotten_tomatoes"].dataset_split == "test"
    assert by_name["perplexity @ 64 tokens"].metric_args == {"stride": 64, "windows": 1, "context_length": 64}
    text = card.text
    for piece in ["swapped from **`learned`** to **`rope`**", "| option `theta` | `500.0` |",
                  'hf_posenc.from_pretrained("me/gpt2-rope", model_cls=AutoModelForCausalLM)',
                  'AutoModelForCausalLM.from_pretrained("me/gpt2-rope", trust_remote_code=True)',
                  repr(hp.describe(model)), "![eval/perplexity.png](eval/perplexity.png)",
                  "![eval/passkey.png](eval/passkey.png)", "`hf-posenc eval` results from `eval/results.json`",
                  "| metric | setting | tiny rope() |", "| perplexity | 128 tokens | skipped: IndexError",
                  "| classification f1 | rotten_tomatoes | 0.6 |"]:
        assert piece in text, piece


def test_export_keeps_the_folders_own_card_and_refuses_bad_targets(tmp_path, saved):
    folder, _ = saved
    (folder / "README.md").write_text("---\nlicense: mit\n---\n# hand-written\n")
    repo = hub.export(folder, tmp_path / "staged")
    assert (repo / "README.md").read_text() == (folder / "README.md").read_text()
    with pytest.raises(PosEncError, match="already exists"):
        hub.export(folder, repo)
    with pytest.raises(PosEncError, match="inside"):
        hub.export(folder, folder / "staged")
    with pytest.raises(PosEncError, match="no config.json"):
        hub.export(folder / "eval", tmp_path / "x")
    with pytest.raises(PosEncError, match="not a Hub repo id"):
        hub.export(folder, tmp_path / "y", repo_id="two words")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "posenc": {**config["posenc"], "format": 99}}))
    with pytest.raises(PosEncError, match="newer hf-posenc"):
        hub.export(folder, tmp_path / "z")
    assert not (tmp_path / "z").exists()


def test_push_without_the_hub_fails_clearly_and_changes_nothing(tmp_path, saved, monkeypatch):
    folder, _ = saved
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # never reach the real Hub
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    before = _snapshot(folder)
    with pytest.raises(PosEncError, match=r"'me/gpt2-rope' failed \(OfflineModeIsEnabled.*local folder is unchanged"):
        hub.push(folder, "me/gpt2-rope", token="hf_not_a_real_token")
    assert _snapshot(folder) == before
    assert list((tmp_path / "tmp").iterdir()) == []  # the staging copy is gone too
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    assert cli.main(["push", str(folder), "me/gpt2-rope"]) == 2  # no token: refused before anything is staged
    assert _snapshot(folder) == before


def test_card_and_push_commands(tmp_path, saved, capsys):
    folder, _ = saved
    for command in ("card", "push"):
        with pytest.raises(SystemExit) as exit_info:
            cli.main([command, "--help"])
        assert exit_info.value.code == 0
        assert f"examples:\n  hf-posenc {command} " in capsys.readouterr().out
    assert cli.main(["card", str(folder), "--base-model", "openai-community/gpt2"]) == 0
    card = ModelCard.load(folder / "README.md")
    assert card.data.base_model == "openai-community/gpt2" and len(card.data.eval_results) == 6
    assert cli.main(["push", str(folder), "me/gpt2-rope", "--dry-run", str(tmp_path / "staged")]) == 0
    # the staged card names the repo it goes to, not the local folder; the weights are hard links, not copies
    local_card = (folder / "README.md").read_text()
    assert '"./gpt2-rope"' in local_card
    assert (tmp_path / "staged" / "README.md").read_text() == local_card.replace('"./gpt2-rope"', '"me/gpt2-rope"')
    assert (tmp_path / "staged" / "model.safetensors").stat().st_ino == (folder / "model.safetensors").stat().st_ino
    assert cli.main(["card", str(tmp_path / "missing")]) == 2
    assert "is not a folder" in capsys.readouterr().err


def test_card_of_a_real_training_run(tmp_path):
    from test_train import recipe_dict, run_cli, tiny_assets, write_recipe

    assets = tiny_assets(tmp_path)
    out = tmp_path / "run"
    recipe = recipe_dict(assets, out, plot=True, perplexity_lengths=[16], eval_max_windows=2)
    proc = run_cli([str(write_recipe(tmp_path / "recipe.yaml", recipe))])
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = results.load(out / "results.json")
    assert [run.label for run in record.runs] == ["original", "before training", "after training"]
    ppl = [run.metrics["perplexity"] for run in record.runs]

    card = hub.model_card(out, "HuggingFaceTB/SmolLM2-135M")
    assert card.data.base_model == "HuggingFaceTB/SmolLM2-135M" and "posenc-alibi" in card.data.tags
    metrics = {r.metric_name: r.metric_value for r in card.data.eval_results}
    assert metrics == {  # the model in the folder is the one after training
        "perplexity @ 16 tokens": round(ppl[2]["16"]["perplexity"], 4),
        "perplexity @ 32 tokens": round(ppl[2]["32"]["perplexity"], 4),
    }
    assert {r.dataset_type for r in card.data.eval_results} == {"data.jsonl"}  # no local path in a public card
    text = card.text
    row = "| perplexity | 32 tokens | " + " | ".join(f"{p['32']['perplexity']:.4g}" for p in ppl) + " |"
    for piece in ["swapped from **`rope`** to **`alibi`**", "then fine-tuned with the recipe below",
                  "\nscheme: alibi", "\nmax_steps: 6", "| metric | setting | original | before training | after training |",
                  row, "![loss.png](loss.png)"]:
        assert piece in text, piece
    trained = hp.from_pretrained(str(out)).eval()
    ids = torch.randint(3, 30, (1, 24))
    # the run folder itself and its export load patched through plain transformers, or not at all
    for folder in (out, hub.export(out, tmp_path / "staged")):
        loaded = transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
        assert torch.equal(_output(loaded, ids), _output(trained, ids))
        with pytest.raises(ValueError, match="trust_remote_code=True"):
            transformers.AutoModelForCausalLM.from_pretrained(folder)


def test_cards_name_base_model_license_datasets_and_the_baseline(tmp_path, saved):
    folder = tmp_path / "eval-alibi"
    posenc = {"format": 1, "scheme": "alibi", "options": {"max_bias": 8.0}, "from": "rope"}
    cell = {"perplexity": 12.5, "loss": 2.5, "tokens": 63, "windows": 1, "stride": 64}
    record = results.Results("eval", "smollm2", complete=True, settings={"suite": ["perplexity", "sst2"],
                                                                        "text": "wikitext", "dtype": "float32"}, format=3,
                             runs=[results.Run("smollm2 alibi()", "alibi", {}, posenc, {"perplexity": {"64": cell}}),
                                   results.Run("smollm2 (unpatched)", metrics={"perplexity": {"64": {**cell,
                                                                                                   "perplexity": 4.0}}})])
    folder.mkdir()
    record.save(folder / "results.json", complete=True)
    card = hub.model_card(folder)
    assert card.data.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct" and card.data.license == "apache-2.0"
    assert card.data.datasets == ["glue", "wikitext"] and card.data.library_name == "transformers"
    assert "`SmolLM2-135M-Instruct` from [`HuggingFaceTB/SmolLM2-135M-Instruct`]" in card.text  # names its model
    assert "swapped from **`rope`** to **`alibi`**" in card.text and "How to load" not in card.text
    assert "| metric | setting | smollm2 alibi() | smollm2 (unpatched) |" in card.text
    assert "| perplexity | 64 tokens | 12.5 | 4 |" in card.text  # the baseline row beside the patched one
    assert [r.metric_value for r in card.data.eval_results] == [12.5]  # the index describes the patched model

    # a card rewritten later keeps what the earlier one knew (hf-posenc patch writes one at once)
    model_folder, _ = saved
    (model_folder / "README.md").write_text(str(hub.model_card(model_folder, "org/base")).replace(
        "library_name:", "license: mit\nlibrary_name:"))
    again = hub.model_card(model_folder)
    assert again.data.base_model == "org/base" and again.data.license == "mit"
    assert again.data.pipeline_tag == "text-generation" and "posenc-rope" in again.data.tags
