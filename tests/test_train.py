"""Recipe runner: schema errors before compute, a real run end to end, reload merged and unmerged.

Helpers here (`tiny_assets`, `write_recipe`, `run_cli`) are shared with test_train_distributed.py.
"""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from conftest import tiny_model

import hf_posenc
from hf_posenc import cli, folders, results
from hf_posenc.errors import PosEncError
from hf_posenc.train import load_recipe
from hf_posenc.train.run_folder import preflight

REPO = Path(__file__).resolve().parents[1]
WORDS = "the a cat dog bird sat ran flew on under over mat log tree and then it was red blue big small".split()


def _char_tokenizer(path: Path) -> None:
    """A character-level fast tokenizer (vocab < 128) so tiny models get real text, offline."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = sorted(set("".join(WORDS) + " .,"))
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{c: i + 3 for i, c in enumerate(chars)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>").save_pretrained(path)


def _sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))) + "." for _ in range(n)]


def tiny_assets(root: Path, model_type: str = "llama") -> dict[str, Path]:
    """A saved tiny random model with a char tokenizer, and a jsonl text dataset."""
    model_dir, data = root / "model", root / "data.jsonl"
    if not model_dir.exists():
        model = tiny_model(model_type)
        model.config.use_cache = False
        model.save_pretrained(model_dir)
        _char_tokenizer(model_dir)
        data.write_text("".join(json.dumps({"text": s, "label": len(s) % 2}) + "\n" for s in _sentences(400, 0)))
    return {"model": model_dir, "data": data}


def recipe_dict(assets: dict[str, Path], out: Path, **fields: Any) -> dict:
    """A small recipe over `assets` writing to `out`; `fields` set or replace its fields."""
    return {"model_name_or_path": str(assets["model"]), "scheme": "alibi", "use_peft": True, "lora_r": 4,
            "dataset_name": str(assets["data"]), "seq_len": 32, "max_eval_samples": 8, "max_steps": 6,
            "global_batch_size": 4, "per_device_train_batch_size": 1, "learning_rate": 3e-3, "warmup_steps": 1,
            "lr_scheduler_type": "cosine", "seed": 0, "save_strategy": "no", "per_device_eval_batch_size": 4,
            "output_dir": str(out), "plot": False, **fields}


def write_recipe(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def run_cli(args: list[str], timeout: float = 240, **popen) -> subprocess.CompletedProcess:
    """`python -m hf_posenc.cli train ...` in a real process, offline, single-threaded for determinism."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run([sys.executable, "-m", "hf_posenc.cli", "train", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout, **popen)


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> dict[str, Path]:
    return tiny_assets(tmp_path_factory.mktemp("tiny"))


# --- bad input: each a PosEncError naming file, field and allowed values, before any compute ---

@pytest.mark.parametrize("fields, pieces", [
    ({"lerning_rate": 1.0}, ["'lerning_rate'", "did you mean 'learning_rate'", "TrainingArguments"]),
    ({"max_steps": "ten"}, ["max_steps: invalid int value: 'ten'"]),
    ({"max_steps": 2.5}, ["max_steps", "expected int", "2.5"]),
    ({"lr_scheduler_type": "step"}, ["lr_scheduler_type: 'step' is not one of", "'cosine'"]),
    ({"optim": "sgdd"}, ["optim: 'sgdd' is not one of", "'adamw_torch'"]),
    ({"trainable": ["norms", "bias"]}, ["trainable", "'bias'", "posenc, embeddings, norms, head"]),
    ({"global_batch_size": 6, "per_device_train_batch_size": 4}, ["global_batch_size", "multiple"]),
    ({"gradient_accumulation_steps": 2}, ["gradient_accumulation_steps", "derived from global_batch_size"]),
    ({"scheme": "yarn", "scheme_options": {"factr": 4}}, ["scheme", "factr"]),
    ({"scheme": "spiral"}, ["scheme", "spiral"]),
    ({"output_dir": None}, ["output_dir", "required"]),
    # recovery fields (issue 21): PoSE, distillation, the recovery curve
    ({"eval_every_steps": -1}, ["eval_every_steps", ">= 0"]),
    ({"pose": {"target_length": 16}}, ["pose.target_length", "> seq_len=32"]),
    ({"pose": {"chunks": 2}}, ["pose.target_length", "required"]),
    ({"pose": {"target_length": 128, "chunks": 0}}, ["pose.chunks", "1..seq_len=32"]),
    ({"pose": {"target_length": 128, "chunk": 2}}, ["pose", "'chunk'", "did you mean 'chunks'"]),
    ({"pose": 512}, ["pose", "expected mapping", "512"]),
    ({"pose": {"target_length": 128}, "task": "classification"}, ["pose", "causal LMs"]),
    ({"objective": "kd"}, ["objective", "'lm', 'distill', 'lm+distill'"]),
    ({"objective": "distill", "distill": {"temperature": 0}}, ["distill.temperature", "> 0"]),
    ({"objective": "distill", "distill": {"weight": "high"}}, ["distill.weight", "float"]),
    ({"objective": "distill", "distill": {"temprature": 2}}, ["distill", "did you mean 'temperature'"]),
    ({"distill": {"temperature": 2}}, ["distill", "objective 'lm'"]),
])
def test_recipe_errors_name_file_field_and_allowed(tmp_path, assets, fields, pieces):
    path = write_recipe(tmp_path / "bad.yaml", recipe_dict(assets, tmp_path / "out", **fields))
    with pytest.raises(PosEncError) as err:
        load_recipe(path)
    message = str(err.value)
    assert str(path) in message
    for piece in pieces:
        assert piece in message, message


def test_overrides_typed_and_checked(tmp_path, assets):
    path = write_recipe(tmp_path / "r.yaml", recipe_dict(assets, tmp_path / "out"))
    recipe = load_recipe(path, ["--learning_rate", "1e-4", "--max_steps=3", "--lora_target_modules", "q_proj", "v_proj",
                                "--merge_lora", "false", "--scheme_options", "{max_bias: 4}", "--full_determinism",
                                "--report_to", "tensorboard"])
    assert recipe.training.learning_rate == 1e-4 and recipe.training.max_steps == 3
    assert recipe.model.lora_target_modules == ["q_proj", "v_proj"] and recipe.posenc.merge_lora is False
    assert recipe.posenc.scheme_options == {"max_bias": 4} and recipe.training.full_determinism is True
    assert recipe.trainer_fields["report_to"] in ("tensorboard", ["tensorboard"]) and recipe.to_dict()["max_steps"] == 3
    assert load_recipe(path, ["--lora_target_modules", "all-linear"]).model.lora_target_modules == "all-linear"
    control = load_recipe(path, ["--scheme", "null", "--scheme_options", "{}"])  # the same run, no swap
    assert control.posenc.scheme is None and control.posenc.scheme_options == {}
    assert load_recipe(path, ["--scheme", "nope", "--scheme_layers", "[1]"]).posenc.scheme_layers == [1]
    with pytest.raises(PosEncError, match="--max_steps.*invalid int value: 'many'"):
        load_recipe(path, ["--max_steps", "many"])
    with pytest.raises(PosEncError, match="did you mean 'max_steps'"):
        load_recipe(path, ["--max_step", "3"])
    with pytest.raises(PosEncError, match="override --training.max_steps: fields have no sections now; use --max_steps"):
        load_recipe(path, ["--training.max_steps", "3"])
    with pytest.raises(PosEncError, match="use --learning_rate"):
        load_recipe(path, ["--training.lr=3"])
    with pytest.raises(PosEncError, match="scheme_options: must be a mapping"):
        load_recipe(path, ["--scheme_options", "max_bias"])


def test_trls_model_and_script_fields_are_honoured_or_refused(tmp_path, assets):
    """The model and data fields are TRL's `ModelConfig` / `ScriptArguments`: DoRA, rsLoRA and lora_modules_to_save
    reach peft's LoraConfig; what a run cannot honour (4-bit loading, streaming, a revision) is refused by name."""
    from hf_posenc.train import modeling

    for fields, field in [({"load_in_4bit": True}, "load_in_4bit"), ({"dataset_streaming": True}, "dataset_streaming"),
                          ({"model_revision": "v2"}, "model_revision"), ({"lora_task_type": "SEQ_CLS"}, "lora_task_type")]:
        with pytest.raises(PosEncError, match=f"r.yaml: {field}: .* is not supported: .*leave it at"):
            load_recipe(write_recipe(tmp_path / "r.yaml", recipe_dict(assets, tmp_path / "out", **fields)))
    recipe = load_recipe(write_recipe(tmp_path / "r.yaml", recipe_dict(assets, tmp_path / "out", trainable=[])),
                         ["--use_dora", "--use_rslora", "true", "--lora_modules_to_save", "lm_head"])
    assert recipe.model.lora_r == 4 and recipe.model.use_dora and recipe.model.use_rslora
    model, _ = modeling.load_recipe_model(recipe)
    config = modeling.select_trainable(model, recipe, modeling.apply_posenc(model, recipe)).peft_config["default"]
    assert config.use_dora and config.use_rslora and config.modules_to_save == ["lm_head"]


def test_a_run_folder_from_before_a_field_was_added_still_resumes(tmp_path, assets):
    """run.json of a run whose recipe lacked today's fields (TRL's ModelConfig ones): those count at their defaults,
    so the resume guard names only what changed."""
    from hf_posenc.train.run_folder import RUN_FILE, _recipe_changes
    from hf_posenc.train.recipe import UNSUPPORTED

    recipe = load_recipe(write_recipe(tmp_path / "r.yaml", recipe_dict(assets, tmp_path / "out")))
    saved = {k: v for k, v in recipe.to_dict().items() if k not in {*UNSUPPORTED, "use_dora", "use_rslora"}}
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / RUN_FILE).write_text(json.dumps({"recipe": saved}))
    assert _recipe_changes(tmp_path / "out", recipe) == []
    assert _recipe_changes(tmp_path / "out", load_recipe(tmp_path / "r.yaml", ["--use_dora"])) == ["use_dora"]


def test_a_recipe_of_the_sectioned_format_is_refused_naming_each_new_field(tmp_path, assets):
    """The format before (model:/data:/training:/... sections): refused before anything loads, each old field
    named with its new name, so one reading of the message converts the file."""
    old = {"model": {"name_or_path": str(assets["model"])}, "data": {"dataset": "kjv", "seq_len": 32},
           "training": {"max_steps": 2, "lr": 1e-3, "batch_size": 2, "threads": 1},
           "evaluation": {"every_steps": 1}, "output": {"dir": str(tmp_path / "o")}, "trainer": {"optim": "sgd"}}
    with pytest.raises(PosEncError) as err:
        load_recipe(write_recipe(tmp_path / "old.yaml", old))
    message = str(err.value)
    for piece in [str(tmp_path / "old.yaml"), "model.name_or_path -> model_name_or_path", "data.dataset -> dataset_name",
                  "data.seq_len -> seq_len", "training.lr -> learning_rate", "training.batch_size -> global_batch_size",
                  "training.threads -> threads", "evaluation.every_steps -> eval_every_steps",
                  "output.dir -> output_dir", "trainer.optim -> optim"]:
        assert piece in message, message


def test_missing_column_and_unsupported_scheme_fail_before_loading(tmp_path, assets):
    recipe = load_recipe(write_recipe(tmp_path / "c.yaml", recipe_dict(assets, tmp_path / "o1", text_column="body")))
    with pytest.raises(PosEncError, match=r"text_column: column 'body' not in .* columns: text, label"):
        preflight(recipe, False, False, 1)
    cls = recipe_dict(assets, tmp_path / "o2", task="classification", label_column="stars")
    with pytest.raises(PosEncError, match="label_column: column 'stars'"):
        preflight(load_recipe(write_recipe(tmp_path / "l.yaml", cls)), False, False, 1)
    bert = tiny_assets(tmp_path / "bert", "bert")  # the registry decides support; BERT lacks some q/k schemes
    unsupported = [s for s in hf_posenc.list_schemes() if not hf_posenc.supports(tiny_model("bert").config, s)]
    if not unsupported:
        pytest.skip("bert supports every scheme")
    bad = recipe_dict(bert, tmp_path / "o3", scheme=unsupported[0])
    with pytest.raises(PosEncError, match=rf"scheme: 'bert' does not support '{unsupported[0]}'; supported: "):
        preflight(load_recipe(write_recipe(tmp_path / "u.yaml", bad)), False, False, 1)


def test_output_dir_holding_a_run_is_refused(tmp_path, assets):
    out = tmp_path / "out"
    out.mkdir()
    (out / "run.json").write_text(json.dumps({"recipe": {}}))
    recipe = load_recipe(write_recipe(tmp_path / "r.yaml", recipe_dict(assets, out)))
    with pytest.raises(PosEncError, match="already holds a run, with no checkpoint to continue from; pass --overwrite"):
        preflight(recipe, False, False, 1)
    with pytest.raises(PosEncError, match="has no .hf-posenc.json marker"):
        preflight(recipe, False, True, 1)  # a run of an hf-posenc before the marker: the user deletes it
    folders.mark(out, "train")
    preflight(recipe, False, True, 1)  # --overwrite accepted
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("mine")
    foreign = load_recipe(write_recipe(tmp_path / "f.yaml", recipe_dict(assets, tmp_path / "foreign")))
    with pytest.raises(PosEncError, match="holds no hf-posenc run"):
        preflight(foreign, False, True, 1)  # never deletes a folder it did not write


def test_resume_needs_a_checkpoint_unless_auto(tmp_path, assets):
    out = tmp_path / "out"
    path = write_recipe(tmp_path / "r.yaml", recipe_dict(assets, out))
    recipe = load_recipe(path)
    with pytest.raises(PosEncError, match="--resume: .* has no checkpoint to continue from; .*--resume auto"):
        preflight(recipe, True, False, 1)
    assert preflight(recipe, "auto", False, 1)[1:] == (False, False)  # nothing there: a new run
    out.mkdir()
    (out / "run.json").write_text(json.dumps({"recipe": recipe.to_dict()}))
    folders.mark(out, "train", complete=False)
    assert preflight(recipe, "auto", False, 1)[1:] == (False, True)  # this run, stopped unsaved: start it over
    assert preflight(recipe, False, False, 1)[1:] == (False, True)  # as its plain rerun does
    other = load_recipe(write_recipe(tmp_path / "o.yaml", recipe_dict(assets, out, learning_rate=0.5)))
    with pytest.raises(PosEncError, match="already holds a run"):
        preflight(other, "auto", False, 1)  # another recipe's run is never replaced by auto
    (out / "checkpoints" / "checkpoint-2").mkdir(parents=True)
    (out / "checkpoints" / "checkpoint-2" / "trainer_state.json").write_text("{}")
    assert preflight(recipe, "auto", False, 1)[1:] == (True, False)
    fresh = write_recipe(tmp_path / "f.yaml", recipe_dict(assets, tmp_path / "fresh"))
    assert cli.main(["train", str(fresh), "--resume"]) == 2 and not (tmp_path / "fresh").exists()


def test_cli_reports_error_without_traceback(tmp_path, assets):
    path = write_recipe(tmp_path / "bad.yaml", recipe_dict(assets, tmp_path / "out", lrr=1))
    proc = run_cli([str(path)])
    assert proc.returncode == 2
    assert "error:" in proc.stderr and "unknown field 'lrr'" in proc.stderr and "Traceback" not in proc.stderr


# --- a real run ---

def test_run_writes_logs_and_reloads_merged_and_unmerged(tmp_path, assets):
    import peft

    runs = {}
    for merge in (True, False):
        out = tmp_path / f"run-{merge}"
        path = write_recipe(tmp_path / f"r{merge}.yaml", recipe_dict(assets, out, merge_lora=merge, plot=True))
        proc = run_cli([str(path)])
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[merge] = out
    out = runs[True]
    record = results.load(out / "results.json")
    assert "trained 6 steps on 1 process(es)" in proc.stdout and "| after training | perplexity @ 32 tokens |" in proc.stdout
    log = json.loads((out / "loss.json").read_text())
    assert [r["step"] for r in log] == list(range(1, 7)) and all(r["tokens_per_s"] > 0 for r in log)
    assert all(b["elapsed_s"] > a["elapsed_s"] > 0 for a, b in zip(log, log[1:]))
    assert (out / "loss.png").stat().st_size > 0
    assert record.kind == "train" and record.complete and record.settings["max_steps"] == 6
    assert record.details["world_size"] == 1 and record.details["samples_per_rank"] == [24]
    original, before, after = (record.run(label).metrics["perplexity"]["32"]
                               for label in ("original", "before training", "after training"))
    assert after["loss"] < before["loss"]
    assert original["loss"] != before["loss"]  # the swap changed the model
    assert before["windows"] == 8 and before["tokens"] == 8 * 31 and before["perplexity"] == pytest.approx(
        math.exp(before["loss"]))
    assert record.run("after training").posenc["scheme"] == "alibi" and record.run("original").posenc is None
    run = json.loads((out / "run.json").read_text())
    assert 0 < run["trainable_parameters"] < run["total_parameters"]
    marker = folders.read_marker(out)  # the run folder is hf-posenc's: --overwrite may replace it
    assert marker["command"] == "train" and marker["sources"][0] == str(tmp_path / "rTrue.yaml")

    batch = torch.randint(3, 30, (2, 24))
    merged = hf_posenc.from_pretrained(out)
    assert hf_posenc.describe(merged).scheme == "alibi"
    base = hf_posenc.from_pretrained(runs[False])
    unmerged = peft.PeftModel.from_pretrained(base, runs[False] / "adapter")
    with torch.no_grad():
        a, b = merged.eval()(batch).logits, unmerged.eval()(batch).logits
    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)  # same training, saved two ways


def test_held_out_scores_reach_tensorboard_in_an_epoch_based_run(tmp_path, assets):
    """Evaluation is Trainer's: `eval_strategy: epoch` with `eval_on_start` on a recipe trained by epochs (no
    max_steps), its held-out tables logged so that `report_to: tensorboard` writes them into a real event file in
    the run folder, the same numbers as results.json and the recovery curve; `load_best_model_at_end` works."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    path = write_recipe(tmp_path / "r.yaml", recipe_dict(
        assets, out, max_steps=-1, num_train_epochs=2, max_train_samples=16, eval_strategy="epoch",
        save_strategy="epoch", load_best_model_at_end=True, report_to="tensorboard", save_model=False))
    proc = run_cli([str(path)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = results.load(out / "results.json")
    assert record.details["steps"] == 8  # 16 blocks of 4 a step, twice
    assert [row["step"] for row in record.details["curve"]] == [0, 4, 8]
    files = list(out.rglob("events.out.tfevents.*"))
    assert files, sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    scalars = {}
    for file in files:
        events = EventAccumulator(str(file))
        events.Reload()
        for tag in events.Tags()["scalars"]:
            scalars.setdefault(tag, {}).update({e.step: e.value for e in events.Scalars(tag)})
    held_out = scalars["eval/perplexity/32/perplexity"]
    assert sorted(held_out) == [0, 4, 8], scalars.keys()
    before = record.run("before training").metrics["perplexity"]["32"]
    assert held_out[0] == pytest.approx(before["perplexity"], rel=1e-5)
    assert scalars["eval/loss"][0] == pytest.approx(before["loss"], rel=1e-5)
    assert scalars["eval/original_perplexity/32/perplexity"][0] == pytest.approx(
        record.run("original").metrics["perplexity"]["32"]["perplexity"], rel=1e-5)
    assert "train/loss" in scalars


def test_classification_recipe_with_rope_on_bert(tmp_path):
    bert = tiny_assets(tmp_path / "bert", "bert")
    path = write_recipe(tmp_path / "cls.yaml", recipe_dict(
        bert, tmp_path / "out", task="classification", scheme="rope", use_peft=False, max_steps=3,
        learning_rate=1e-3))
    proc = run_cli([str(path)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = results.load(tmp_path / "out" / "results.json")
    assert [run.label for run in record.runs] == ["before training", "after training"]  # no original for a new head
    for run in record.runs:
        cell = run.metrics["classification"][str(bert["data"])]
        assert 0 <= cell["accuracy"] <= 1 and 0 <= cell["f1"] <= 1 and cell["loss"] > 0
        assert cell["mode"] == "classifier" and cell["examples"] == 8
    model = hf_posenc.from_pretrained(tmp_path / "out", model_cls=__import__("transformers").AutoModelForSequenceClassification)
    assert hf_posenc.describe(model).scheme == "rope"


def test_lora_trains_projections_plus_new_positional_params_norms_embeddings(tmp_path, assets):
    from hf_posenc.train import modeling

    data = recipe_dict(assets, tmp_path / "o", scheme="learned", trainable=["posenc", "norms"])
    recipe = load_recipe(write_recipe(tmp_path / "r.yaml", data))
    model = tiny_model("gpt2")
    new = modeling.apply_posenc(model, recipe)
    assert new and all("wpe" in n for n in new)  # the learned table the patch installed
    wrapped = modeling.select_trainable(model, recipe, new)
    trainable = {n for n, p in wrapped.named_parameters() if p.requires_grad}
    # the groups trained in full are peft's `modules_to_save`: a trained copy each, saved with the adapter (so a
    # checkpoint holds them), the original frozen
    assert any("lora_A" in n for n in trainable) and any(n.endswith("wpe.modules_to_save.default.weight") for n in trainable)
    assert any(".ln_1.modules_to_save." in n for n in trainable) and not any("wte" in n for n in trainable)
    assert not any(n.endswith("c_attn.base_layer.weight") or "original_module" in n for n in trainable)  # frozen


def test_deterministic_holds_for_the_run_only(assets, tmp_path, monkeypatch):
    """`full_determinism` (TrainingArguments') switches torch's deterministic algorithms on for the run, with the
    workspace CUDA's matmuls then need, and back off after it: train() in a notebook must not change the rest of
    the caller's process."""
    from transformers import trainer_utils

    from hf_posenc.train import train

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    seen, enable = [], trainer_utils.enable_full_determinism
    monkeypatch.setattr("transformers.trainer.enable_full_determinism", lambda *a, **k: (
        enable(*a, **k), seen.append((torch.are_deterministic_algorithms_enabled(),
                                      os.environ.get("CUBLAS_WORKSPACE_CONFIG")))))
    assert not torch.are_deterministic_algorithms_enabled()
    data = recipe_dict(assets, tmp_path / "out", max_steps=2, full_determinism=True)
    assert train(load_recipe(write_recipe(tmp_path / "r.yaml", data))).run("after training")
    assert not torch.are_deterministic_algorithms_enabled()
    assert seen and seen[0][0] and seen[0][1] and "CUBLAS_WORKSPACE_CONFIG" not in os.environ


def test_a_bf16_run_then_an_fp32_run_in_one_process(assets, tmp_path):
    """A notebook trains a bf16 recipe, then an fp32 one: the first run's precision held for that run only
    (accelerate's process-wide state made the second fail with "restart your runtime"); a state the caller
    made before a run is left as it was."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    from hf_posenc.train import train

    AcceleratorState._reset_state(reset_partial_state=True)  # whatever an earlier test of this worker left
    for precision in ("bf16", "no"):
        data = recipe_dict(assets, tmp_path / precision, max_steps=1, bf16=precision == "bf16")
        record = train(load_recipe(write_recipe(tmp_path / f"{precision}.yaml", data)))
        assert record.run("after training").metrics["perplexity"]
        assert not AcceleratorState._shared_state, precision
    own = Accelerator(cpu=True, mixed_precision="bf16")
    data = recipe_dict(assets, tmp_path / "own", max_steps=1, bf16=True)
    train(load_recipe(write_recipe(tmp_path / "own.yaml", data)))
    assert own.state.mixed_precision == "bf16" and AcceleratorState().mixed_precision == "bf16"
    AcceleratorState._reset_state(reset_partial_state=True)


@pytest.mark.parametrize("sft", [False, True], ids=["Trainer", "SFTTrainer"])
@pytest.mark.parametrize("objective", ["lm", "lm+distill"])
def test_micro_batches_weigh_by_their_target_tokens(assets, tmp_path, objective, sft):
    """Two rows, one padded to a third of its length: accumulated as two micro-batches of one row, the step's loss
    is the mean over the step's target tokens (Trainer's num_items_in_batch, which the objective and TRL's fused
    head divide by), as in one micro-batch of both rows, not the mean of the two rows' means; on Trainer (the rows
    padded here) and on TRL's SFTTrainer (which pads them)."""
    import datasets
    from transformers import TrainingArguments
    from trl import SFTConfig

    from hf_posenc.train import objectives
    from hf_posenc.train.trainer import PosEncSFTTrainer, PosEncTrainer

    recipe = load_recipe(write_recipe(tmp_path / "r.yaml", recipe_dict(assets, tmp_path / "o",
                                                                        objective=objective)))
    tokenizer = __import__("transformers").AutoTokenizer.from_pretrained(assets["model"])
    ids = torch.randint(3, 120, (2, 24), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0  # the second row: 8 tokens, then padding
    labels = ids.masked_fill(mask == 0, -100)
    rows = datasets.Dataset.from_dict({"input_ids": ids.tolist(), "attention_mask": mask.tolist(),
                                       "labels": labels.tolist()})

    def step_loss(micro: int) -> float:
        model = tiny_model("llama")
        objective_, _ = objectives.build(recipe, model)
        hf_posenc.patch(model, "alibi")
        settings = dict(output_dir=str(tmp_path / f"t{micro}{sft}"), max_steps=1, per_device_train_batch_size=micro,
                        gradient_accumulation_steps=2 // micro, logging_steps=1, report_to="none", use_cpu=True,
                        save_strategy="no", disable_tqdm=True, learning_rate=5e-5)
        if sft:  # the rows unpadded: TRL makes the labels and pads them
            texts = datasets.Dataset.from_dict({"input_ids": [ids[0].tolist(), ids[1, :8].tolist()]})
            trainer = PosEncSFTTrainer(model=model, args=SFTConfig(**settings, gradient_checkpointing=False, bf16=False,
                                                                   shuffle_dataset=False),
                                       train_dataset=texts, processing_class=tokenizer, objective=objective_)
        else:
            trainer = PosEncTrainer(model=model, args=TrainingArguments(**settings), train_dataset=rows,
                                    objective=objective_, data_collator=lambda batch: {
                                        k: torch.tensor([b[k] for b in batch]) for k in batch[0]})
        trainer.train()
        return trainer.state.log_history[0]["loss"]

    accumulated, whole = step_loss(1), step_loss(2)
    assert accumulated == pytest.approx(whole, rel=1e-5)
    model = hf_posenc.patch(tiny_model("llama"), "alibi")
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
    per_token = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), labels[:, 1:], reduction="none")
    scored = labels[:, 1:] != -100
    by_tokens = float(per_token[scored].mean())
    by_rows = float(torch.stack([per_token[i][scored[i]].mean() for i in range(2)]).mean())
    assert abs(by_tokens - by_rows) > 0.01  # the two weightings differ on these rows
    if objective == "lm":
        assert accumulated == pytest.approx(by_tokens, rel=1e-5)
    else:  # the distillation term on top, weighted alike
        assert accumulated > by_tokens


def test_the_thread_count_does_not_change_the_losses(assets, tmp_path):
    """`threads` holds torch's CPU threads for the run: the same recipe started from a process at 1 thread
    and from one at 2 gives the same losses and held-out scores, bit for bit, and the caller's count is back after."""
    from hf_posenc.train import train

    caller, runs = torch.get_num_threads(), {}
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            data = recipe_dict(assets, tmp_path / f"t{count}", max_steps=3, threads=2, eval_original=False,
                               save_model=False)
            record = train(load_recipe(write_recipe(tmp_path / f"t{count}.yaml", data)))
            assert torch.get_num_threads() == count
            losses = [row["loss"] for row in json.loads((tmp_path / f"t{count}" / "loss.json").read_text())]
            runs[count] = losses, record.run("after training").metrics
    finally:
        torch.set_num_threads(caller)
    assert len(runs[1][0]) == 3 and runs[1] == runs[2]


def test_one_and_two_threads_give_the_same_losses(tmp_path):
    """The same recipe, seed and data at `threads: 1` and `threads: 2` give the same losses, gradient norms and held-out
    loss, bit for bit, on a model whose matmuls torch splits over threads (a 256-wide Llama, 8192-token vocabulary,
    128-token rows): torch's CPU kernels here split their work by output blocks, not a sum's terms. SmolLM2-135M's
    smoke recipe, 3 steps, was measured the same way (docs/guide/train.md)."""
    import transformers

    from hf_posenc.train import train

    assets = tiny_assets(tmp_path / "small")
    model = tmp_path / "wide"
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=256, intermediate_size=768, num_hidden_layers=2, num_attention_heads=8,
                                      num_key_value_heads=4, vocab_size=8192, max_position_embeddings=512)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(model)
    _char_tokenizer(model)
    runs = {}
    for threads in (1, 2):
        data = recipe_dict({"model": model, "data": assets["data"]}, tmp_path / f"t{threads}", max_steps=3,
                           threads=threads, eval_original=False, save_model=False, seq_len=128, global_batch_size=4,
                           per_device_train_batch_size=4)
        record = train(load_recipe(write_recipe(tmp_path / f"t{threads}.yaml", data)))
        log = json.loads((tmp_path / f"t{threads}" / "loss.json").read_text())
        assert json.loads((tmp_path / f"t{threads}" / "run.json").read_text())["threads"] == threads
        runs[threads] = ([(row["loss"], row["grad_norm"]) for row in log],
                         record.run("after training").metrics["perplexity"]["128"]["loss"])
    assert len(runs[1][0]) == 3 and runs[1] == runs[2]


def test_training_arguments_fields_reach_trainer_by_their_own_names(tmp_path, assets):
    """Any transformers.TrainingArguments field is a recipe field under its own name and reaches the run's Trainer;
    the run sets only where checkpoints go, the accumulation that makes global_batch_size on the processes there
    are, and the device."""
    from hf_posenc.train.runner import _arguments

    recipe = load_recipe(write_recipe(tmp_path / "r.yaml", recipe_dict(
        assets, tmp_path / "out", optim="adamw_torch", adam_beta2=0.95, gradient_checkpointing=True)))
    args = _arguments(recipe, tmp_path / "out", 2, cpu=True)
    assert args.optim == "adamw_torch" and args.adam_beta2 == 0.95 and args.learning_rate == 3e-3
    assert args.gradient_accumulation_steps == 2 and args.per_device_train_batch_size == 1  # 4 = 1 x 2 x 2 processes
    assert args.output_dir == str(tmp_path / "out" / "checkpoints") and args.logging_steps == 1
    assert args.gradient_checkpointing_kwargs == {"use_reentrant": False}
    plain = load_recipe(write_recipe(tmp_path / "p.yaml", {
        k: v for k, v in recipe_dict(assets, tmp_path / "p", gradient_accumulation_steps=3).items()
        if k != "global_batch_size"}))
    assert _arguments(plain, tmp_path / "p", 2, cpu=True).gradient_accumulation_steps == 3  # Trainer's own way


def test_a_run_of_the_loop_before_trainer_is_refused_for_resume_by_name(tmp_path, assets):
    """A folder the pre-Trainer loop wrote (its run.json's recipe has sections; its checkpoints look like Trainer's
    by name): --resume and --resume auto refuse it, saying why and what to do; --overwrite may replace it."""
    out = tmp_path / "out"
    (out / "checkpoints" / "checkpoint-4").mkdir(parents=True)
    (out / "checkpoints" / "checkpoint-4" / "trainer_state.json").write_text(json.dumps({"step": 4}))
    (out / "run.json").write_text(json.dumps({"recipe": {"model": {"name_or_path": str(assets["model"])},
                                                         "data": {"dataset": "kjv"}, "training": {"max_steps": 8}}}))
    folders.mark(out, "train")
    recipe = load_recipe(write_recipe(tmp_path / "r.yaml", recipe_dict(assets, out)))
    for resume in (True, "auto"):
        with pytest.raises(PosEncError, match="cannot resume .*written by the training loop hf-posenc had before "
                                              "recipes ran on transformers' Trainer.*pass --overwrite"):
            preflight(recipe, resume, False, 1)
    assert preflight(recipe, False, True, 1)[1:] == (False, True)
    (out / "run.json").write_text("{not json")
    with pytest.raises(PosEncError, match="run.json: damaged .*--overwrite"):
        preflight(recipe, True, False, 1)
    assert (out / "checkpoints" / "checkpoint-4" / "trainer_state.json").is_file()  # nothing was removed
