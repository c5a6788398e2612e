"""Mistakes on the command line, in recipes and in folders (issue 18): each is refused with exit 2 and
one line naming the flag / field / file and what is allowed, before any weights load, writing nothing;
`--overwrite` replaces only folders carrying hf-posenc's marker, never a source or a folder nested with it.

The CLI runs in-process (`hf_posenc.cli.main`) with a counter around transformers' own
`PreTrainedModel.from_pretrained` (instrumentation of the real call, which still runs), and the whole
workspace is hashed before and after each case. Usage errors also run as real processes that must not
import torch.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import transformers
import yaml
from tokenizers import Tokenizer, models, pre_tokenizers

import hf_posenc as hp
from conftest import TINY, tiny_model
from hf_posenc import cli, folders, results


# ---------------------------------------------------------------- the workspace: model folders, sound and damaged


def _save_tiny(folder: Path, model_type: str = "gpt2") -> Path:
    model = tiny_model(model_type)
    model.save_pretrained(folder)
    vocab = {f"w{i}": i for i in range(TINY["vocab"])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="w0").save_pretrained(folder)
    return folder


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for file in src.iterdir():
        (dst / file.name).write_bytes(file.read_bytes())
    return dst


def _edit_config(folder: Path, **changes: object) -> None:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def _recipe(work: Path, name: str, **fields: object) -> Path:
    """A recipe YAML in the workspace: a sound base (the tiny model, kjv, 1 step) with `fields` set (None: removed)."""
    base = {"model_name_or_path": str(work / "tiny"), "dataset_name": "kjv", "seq_len": 16, "max_steps": 1,
            "global_batch_size": 1, "per_device_train_batch_size": 1, "output_dir": str(work / "run")}
    for field, value in fields.items():
        if value is None:
            base.pop(field)
        else:
            base[field] = value
    path = work / "recipes" / f"{name}.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump(base))
    return path


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("bad-input")
    tiny = _save_tiny(work / "tiny")
    _save_tiny(work / "bert", "bert")
    truncated = _copy(tiny, work / "truncated")
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    header_only = _copy(tiny, work / "header-only")
    (header_only / "model.safetensors").write_bytes(b"\x05")
    (_copy(tiny, work / "no-config") / "config.json").unlink()
    (_copy(tiny, work / "bad-json") / "config.json").write_text('{"model_type": "gpt2",\n "n_embd": }')
    _edit_config(_copy(tiny, work / "posenc-null"), model_type="hf_posenc", posenc=None)
    _edit_config(_copy(tiny, work / "options-null"), posenc={"format": 1, "scheme": "rope", "options": None})
    _edit_config(_copy(tiny, work / "posenc-list"), posenc=["rope"])
    # folders hf-posenc did not write: plain transformers output, even with results.json / run.json in it
    _copy(tiny, work / "stock")
    stock_results = _copy(tiny, work / "stock-results")
    (stock_results / "results.json").write_text("{}")
    (stock_results / "run.json").write_text("{}")
    legacy = work / "legacy-eval"  # what eval wrote before the marker: results.json alone
    legacy.mkdir()
    results.Results("eval", "tiny").save(legacy / "results.json", complete=True)
    fake = _copy(tiny, work / "fake-marker")
    (fake / folders.MARKER).write_text('{"tool": "something-else"}')
    # an hf-posenc folder holding a model folder: replacing it would delete that source
    outer = work / "outer"
    outer.mkdir()
    folders.mark(outer, "eval")
    _copy(tiny, outer / "model")
    evaluated = work / "evaluated"  # a marked eval folder whose results.json is compared
    evaluated.mkdir()
    folders.mark(evaluated, "eval")
    results.Results("eval", "tiny").save(evaluated / "results.json", complete=True)
    (work / "afile").write_text("not a folder")
    (work / "existing").mkdir()
    (work / "existing" / "x").write_text("x")
    (work / "data").mkdir()
    (work / "data" / "train.txt").write_text("in the beginning\n" * 50)
    (work / "accel-bad.yaml").write_text("num_processes: [2\n")
    (work / "accel-zero.yaml").write_text("num_processes: 0\n")
    _recipes(work)
    return work


def _recipes(work: Path) -> None:
    r = lambda name, **s: _recipe(work, name, **s)  # noqa: E731
    (work / "recipes").mkdir()
    (work / "recipes" / "afile").write_text("a file, not a folder")
    (work / "recipes" / "invalid.yaml").write_text("model_name_or_path: x\ntask: x\nmax_steps: 1\nscheme: [alibi\n")
    (work / "recipes" / "tabs.yaml").write_text("model_name_or_path: x\n\tmax_steps: 1\n")
    (work / "recipes" / "list.yaml").write_text("- model\n- data\n")
    (work / "recipes" / "binary.yaml").write_bytes(b"\xff\xfe\x00bad")
    (work / "recipes" / "folder.yaml").mkdir()
    r("ok")
    r("rope", scheme="rope")
    r("old-format", model={"name_or_path": "x"}, training={"lr": 1.0})
    r("unknown-field", max_step=3)
    r("missing-output", output_dir=None)
    r("type-steps", max_steps="ten")
    r("type-lr", learning_rate="fast")
    r("lr-negative", learning_rate=-1.0)
    r("lr-inf", learning_rate=float("inf"))
    r("dropout", lora_dropout=1.5)
    r("task", task="translation")
    r("batch-split", global_batch_size=3, per_device_train_batch_size=2)
    r("eval-samples", max_eval_samples=0)
    r("alpha", lora_alpha=0.0)
    r("seed", seed=-1)
    r("depth-nan", eval_max_windows=float("nan"))
    r("trainable", trainable=["posenc", "everything"])
    r("scheme", scheme="rotary")
    r("scheme-option", scheme="yarn", scheme_options={"factor": "big"})
    r("options-string", scheme="alibi", scheme_options="factor")
    r("options-no-scheme", scheme_options={"factor": 2})
    r("layers-out-of-range", scheme="alibi", scheme_layers=[0, 9])
    r("layers-input-site", scheme="sinusoidal", scheme_layers=[1])
    r("unsupported", model_name_or_path=str(work / "bert"), scheme="xpos")
    r("missing-model", model_name_or_path=str(work / "nowhere"))
    r("truncated-model", model_name_or_path=str(work / "truncated"), scheme="alibi")
    r("out-is-model", output_dir=str(work / "tiny"))
    r("out-in-model", output_dir=str(work / "tiny" / "run"))
    r("out-holds-data", dataset_name=str(work / "data" / "train.txt"), output_dir=str(work / "data"))
    r("out-stock", output_dir=str(work / "stock"))
    r("out-stock-run", output_dir=str(work / "stock-results"))
    r("out-file", output_dir=str(work / "afile"))


# ---------------------------------------------------------------- instrumentation


def snapshot(root: Path) -> dict[str, str]:
    """Every path under root with its content hash (folders too: a new empty folder is a change)."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


# ---------------------------------------------------------------- the cases

OUT = "{work}/out"
# (id, argv, message parts; each case: exit 2, one line, no weights loaded, nothing written)
CASES: list[tuple[str, list[str], list[str]]] = [
    # --- list and the dispatcher (argparse: its usage line, then the error)
    ("list-bad-flag", ["list", "--bogus"], ["unrecognized arguments: --bogus"]),
    ("no-such-command", ["nosuch"], ["invalid choice: 'nosuch'", "choose from"]),
    # --- doctor: names checked before any model is built
    ("doctor-unknown-scheme", ["doctor", "--schemes", "alibii"], ["unknown scheme 'alibii'", "available schemes: alibi"]),
    ("doctor-unknown-model-type", ["doctor", "--model-types", "lama"],
     ["unknown model type(s) 'lama'", "hf-posenc list --model-types"]),
    ("doctor-no-model-types", ["doctor", "--model-types"], ["expected at least one argument"]),
    # --- recipes: names and folders checked before anything is written
    ("recipes-unknown-name", ["recipes", "copy", "smollm2-135m/alibi/smok", OUT], ["no shipped recipe 'smollm2-135m/alibi/smok'", "shipped: bart-tiny/copy/alibi"]),
    ("recipes-copy-no-dir", ["recipes", "copy", "smollm2-135m/alibi/smoke"], ["recipes copy needs NAME and DIR"]),
    ("recipes-copy-existing", ["recipes", "copy", "smollm2-135m/alibi/smoke", "{work}/existing"], ["already exists and is not an empty folder"]),
    ("recipes-copy-file", ["recipes", "copy", "smollm2-135m/alibi/smoke", "{work}/afile"], ["already exists and is not an empty folder"]),
    ("recipes-list-extra", ["recipes", "list", "smollm2-135m/alibi/smoke"], ["recipes takes NAME and DIR only after `copy`"]),
    ("train-unknown-shipped-name", ["train", "smollm2-135m/alibi/smok"], ["no shipped recipe 'smollm2-135m/alibi/smok'"]),
    # --- patch: scheme and options
    ("patch-unknown-scheme", ["patch", "{work}/tiny", "nosuch", "--out", OUT], ["unknown scheme 'nosuch'", "available schemes: alibi"]),
    ("patch-opt-not-number", ["patch", "{work}/tiny", "yarn", "--opt", "factor=abc", "--out", OUT], ["scheme 'yarn': factor must be a number >= 1, got 'abc'"]),
    ("patch-opt-bool", ["patch", "{work}/tiny", "yarn", "--opt", "factor=true", "--out", OUT], ["factor must be a number >= 1, got True"]),
    ("patch-opt-no-value", ["patch", "{work}/tiny", "rope", "--opt", "theta", "--out", OUT], ["--opt takes key=value, got 'theta'"]),
    ("patch-opt-no-key", ["patch", "{work}/tiny", "rope", "--opt", "=3", "--out", OUT], ["--opt takes key=value"]),
    ("patch-opt-unknown", ["patch", "{work}/tiny", "rope", "--opt", "nosuch=1", "--out", OUT], ["has no option 'nosuch'", "it takes: theta"]),
    ("patch-opt-range", ["patch", "{work}/tiny", "rope", "--opt", "theta=-1", "--out", OUT], ["theta must be a number > 0 or null, got -1"]),
    ("patch-opt-int", ["patch", "{work}/tiny", "t5", "--opt", "num_buckets=3.5", "--out", OUT], ["num_buckets must be an int >= 4 or null, got 3.5"]),
    ("patch-no-out", ["patch", "{work}/tiny", "rope"], ["the following arguments are required: --out"]),
    ("patch-bad-flag", ["patch", "{work}/tiny", "rope", "--out", OUT, "--factor", "2"], ["unrecognized arguments: --factor 2"]),
    ("patch-unsupported", ["patch", "{work}/bert", "xpos", "--out", OUT], ["cannot take scheme 'xpos'", "it takes: alibi"]),
    # --- patch: the model's files
    ("patch-missing-model", ["patch", "{work}/nowhere", "rope", "--out", OUT], ["is not a model folder, a Hub id (owner/name) or one of smollm2"]),
    ("patch-dot-path", ["patch", "./nowhere-at-all", "rope", "--out", OUT], ["'./nowhere-at-all' is not a model folder"]),
    ("patch-truncated", ["patch", "{work}/truncated", "rope", "--out", OUT], ["truncated/model.safetensors: cannot read the weights", "damaged or incomplete"]),
    ("patch-header-only", ["patch", "{work}/header-only", "rope", "--out", OUT], ["header-only/model.safetensors: cannot read the weights", "no readable header"]),
    ("patch-no-config", ["patch", "{work}/no-config", "rope", "--out", OUT], ["has no config.json", "model.save_pretrained"]),
    ("patch-bad-json", ["patch", "{work}/bad-json", "rope", "--out", OUT], ["bad-json/config.json", "not valid JSON (line 2, column"]),
    ("patch-posenc-null", ["patch", "{work}/posenc-null", "rope", "--out", OUT], ["posenc-null/config.json", "posenc is missing or null"]),
    ("patch-options-null", ["patch", "{work}/options-null", "rope", "--out", OUT], ["options-null/config.json", "options (a mapping)", "null"]),
    ("patch-posenc-list", ["patch", "{work}/posenc-list", "rope", "--out", OUT], ["posenc-list/config.json", "posenc must be a mapping"]),
    # --- patch: folders
    ("patch-out-is-source", ["patch", "{work}/tiny", "alibi", "--out", "{work}/tiny"], ["is the source (MODEL", "choose a new folder"]),
    ("patch-out-is-source-overwrite", ["patch", "{work}/tiny", "alibi", "--out", "{work}/tiny", "--overwrite"], ["is the source (MODEL"]),
    ("patch-out-inside-source", ["patch", "{work}/tiny", "alibi", "--out", "{work}/tiny/alibi"], ["is inside the source (MODEL", "outside it"]),
    ("patch-out-holds-source", ["patch", "{work}/outer/model", "alibi", "--out", "{work}/outer", "--overwrite"], ["holds the source (MODEL", "would delete the input"]),
    ("patch-out-dotdot", ["patch", "{work}/tiny", "alibi", "--out", "{work}/tiny/../tiny", "--overwrite"], ["is the source (MODEL"]),
    ("patch-out-stock", ["patch", "{work}/tiny", "alibi", "--out", "{work}/stock", "--overwrite"], ["has no .hf-posenc.json marker", "delete it yourself", "choose a new folder"]),
    ("patch-out-stock-results", ["patch", "{work}/tiny", "alibi", "--out", "{work}/stock-results", "--overwrite"], ["has no .hf-posenc.json marker"]),
    ("patch-out-legacy", ["patch", "{work}/tiny", "alibi", "--out", "{work}/legacy-eval", "--overwrite"], ["or an older version did"]),
    ("patch-out-fake-marker", ["patch", "{work}/tiny", "alibi", "--out", "{work}/fake-marker", "--overwrite"], ["has no .hf-posenc.json marker"]),
    ("patch-out-not-empty", ["patch", "{work}/tiny", "alibi", "--out", "{work}/stock"], ["is not empty; choose a new folder, or pass --overwrite"]),
    ("patch-out-marked-no-overwrite", ["patch", "{work}/tiny", "alibi", "--out", "{work}/evaluated"], ["is not empty", "--overwrite"]),
    ("patch-out-file", ["patch", "{work}/tiny", "alibi", "--out", "{work}/afile"], ["is a file; give a folder"]),
    ("patch-out-under-file", ["patch", "{work}/tiny", "alibi", "--out", "{work}/afile/x"], ["is not a writable folder"]),
    # --- eval: every numeric flag's domain
    ("eval-max-windows-0", ["eval", "--model", "{work}/tiny", "--perplexity.max-windows", "0", "--out", OUT], ["--perplexity.max-windows must be an integer >= 1, got 0"]),
    ("eval-max-windows-neg", ["eval", "--model", "{work}/tiny", "--perplexity.max-windows", "-4", "--out", OUT], ["--perplexity.max-windows", ">= 1, got -4"]),
    ("eval-trials-0", ["eval", "--model", "{work}/tiny", "--passkey.trials", "0", "--out", OUT], ["--passkey.trials must be an integer >= 1, got 0"]),
    ("eval-batch-size-0", ["eval", "--model", "{work}/tiny", "--batch-size", "0", "--out", OUT], ["--batch-size must be an integer >= 1, got 0"]),
    ("eval-stride-0", ["eval", "--model", "{work}/tiny", "--perplexity.mode", "sliding", "--perplexity.stride", "0", "--out", OUT], ["--perplexity.stride must be an integer >= 1, got 0"]),
    ("eval-examples-0", ["eval", "--model", "{work}/tiny", "--suite", "copy", "--synthetic.examples", "0", "--out", OUT], ["--synthetic.examples must be an integer >= 1, got 0"]),
    ("eval-limit-neg", ["eval", "--model", "{work}/tiny", "--suite", "rotten_tomatoes", "--sentiment.limit", "-3", "--out", OUT], ["--sentiment.limit must be an integer >= 1, got -3"]),
    ("eval-limit-0", ["eval", "--model", "{work}/tiny", "--sentiment.limit", "0", "--out", OUT], ["--sentiment.limit must be an integer >= 1, got 0"]),
    ("eval-seed-neg", ["eval", "--model", "{work}/tiny", "--seed", "-1", "--out", OUT], ["--seed must be an integer >= 0, got -1"]),
    ("eval-target-tokens-0", ["eval", "--model", "{work}/tiny", "--perplexity.target-tokens", "0", "--out", OUT], ["--perplexity.target-tokens", "in 1..511", "got 0"]),
    ("eval-target-tokens-long", ["eval", "--model", "{work}/tiny", "--lengths", "8", "--perplexity.target-tokens", "8", "--out", OUT], ["--perplexity.target-tokens", "in 1..7"]),
    ("eval-lengths-0", ["eval", "--model", "{work}/tiny", "--lengths", "0,8", "--out", OUT], ["lengths must be positive integers, got '0,8'"]),
    ("eval-lengths-text", ["eval", "--model", "{work}/tiny", "--lengths", "a,b", "--out", OUT], ["lengths must be comma-separated integers"]),
    ("eval-depths-range", ["eval", "--model", "{work}/tiny", "--passkey.depths", "0,2", "--out", OUT], ["--passkey.depths", "in [0, 1]"]),
    ("eval-depths-text", ["eval", "--model", "{work}/tiny", "--passkey.depths", "middle", "--out", OUT], ["depths must be comma-separated numbers"]),
    ("eval-task-lengths-0", ["eval", "--model", "{work}/tiny", "--synthetic.task-lengths", "0", "--out", OUT], ["task lengths must be positive integers"]),
    ("eval-max-windows-text", ["eval", "--model", "{work}/tiny", "--perplexity.max-windows", "all", "--out", OUT], ["argument --perplexity.max-windows: invalid int value: 'all'"]),
    ("eval-dtype", ["eval", "--model", "{work}/tiny", "--dtype", "float64", "--out", OUT], ["argument --dtype: invalid choice: 'float64'", "float32"]),
    # --- eval: names, configs, models, folders
    ("eval-suite", ["eval", "--model", "{work}/tiny", "--suite", "ppl,bleu", "--out", OUT], ["unknown suite 'bleu'", "choose from"]),
    ("eval-ppl-mode", ["eval", "--model", "{work}/tiny", "--perplexity.mode", "rolling", "--out", OUT], ["unknown perplexity mode 'rolling'", "same_target"]),
    ("eval-stride-same-target", ["eval", "--model", "{work}/tiny", "--perplexity.stride", "4", "--out", OUT], ["a stride applies to the sliding perplexity mode"]),
    ("eval-accelerate-config", ["eval", "--model", "{work}/tiny", "--accelerate-config", "nosuch", "--out", OUT], ["accelerate config 'nosuch' not found", "shipped: cpu, cpu_2proc, ddp"]),
    ("eval-accelerate-yaml", ["eval", "--model", "{work}/tiny", "--accelerate-config", "{work}/accel-bad.yaml", "--out", OUT], ["accel-bad.yaml: line 2, column 1", "not valid YAML"]),
    ("eval-accelerate-processes", ["eval", "--model", "{work}/tiny", "--accelerate-config", "{work}/accel-zero.yaml", "--out", OUT], ["accel-zero.yaml", "num_processes is an integer >= 1"]),
    ("eval-no-model", ["eval", "--out", OUT], ["give --model", "or --compare"]),
    ("eval-opt-no-patch", ["eval", "--model", "{work}/tiny", "--opt", "factor=2", "--out", OUT], ["--opt and --layers need --patch SCHEME"]),
    ("eval-unknown-scheme", ["eval", "--model", "{work}/tiny", "--patch", "rotary", "--out", OUT], ["unknown scheme 'rotary'"]),
    ("eval-unsupported", ["eval", "--model", "{work}/bert", "--patch", "xpos", "--out", OUT], ["cannot take scheme 'xpos'"]),
    ("eval-missing-model", ["eval", "--model", "{work}/nowhere", "--out", OUT], ["--model: ", "is not a model folder"]),
    ("eval-truncated", ["eval", "--model", "{work}/truncated", "--out", OUT], ["cannot read the weights", "damaged or incomplete"]),
    ("eval-options-null", ["eval", "--model", "{work}/options-null", "--out", OUT], ["options-null/config.json", "posenc must be a mapping"]),
    ("eval-out-is-model", ["eval", "--model", "{work}/tiny", "--out", "{work}/tiny", "--overwrite"], ["is the source (--model"]),
    ("eval-out-in-model", ["eval", "--model", "{work}/tiny", "--out", "{work}/tiny/eval"], ["is inside the source (--model"]),
    ("eval-out-stock", ["eval", "--model", "{work}/tiny", "--out", "{work}/stock-results", "--overwrite"], ["has no .hf-posenc.json marker"]),
    ("eval-compare-holds-input", ["eval", "--compare", "{work}/evaluated/results.json", "--out", "{work}/evaluated", "--overwrite"], ["holds the source (--compare", "would delete the input"]),
    ("eval-compare-missing", ["eval", "--compare", "{work}/nowhere.json", "--out", OUT], ["cannot read results file", "give a results.json"]),
    ("eval-compare-weights", ["eval", "--compare", "{work}/tiny/model.safetensors", "--out", OUT], ["not a JSON text file"]),
    # --- inspect
    ("inspect-top-k-neg", ["inspect", "{work}/tiny", "--top-k", "-1", "--out", OUT], ["--top-k must be an integer >= 1, got -1"]),
    ("inspect-top-k-0", ["inspect", "{work}/tiny", "--top-k", "0", "--out", OUT], ["--top-k must be an integer >= 1, got 0"]),
    ("inspect-pos-dim-0", ["inspect", "{work}/tiny", "--pos-dim", "0", "--out", OUT], ["--pos-dim must be an integer >= 1, got 0"]),
    ("inspect-seeds-neg", ["inspect", "{work}/tiny", "--seeds", "-2", "--out", OUT], ["--seeds must be an integer >= 2, got -2"]),
    ("inspect-seeds-1", ["inspect", "{work}/tiny", "--seeds", "1", "--out", OUT], ["--seeds must be an integer >= 2, got 1"]),
    ("inspect-empty-text", ["inspect", "{work}/tiny", "--text", " ", "--out", OUT], ["--text is empty"]),
    ("inspect-missing", ["inspect", "{work}/nowhere", "--out", OUT], ["MODEL: ", "is not a model folder"]),
    ("inspect-truncated", ["inspect", "{work}/truncated", "--out", OUT], ["cannot read the weights"]),
    ("inspect-out-is-model", ["inspect", "{work}/tiny", "--out", "{work}/tiny"], ["is the source (MODEL"]),
    ("inspect-out-stock", ["inspect", "{work}/tiny", "--out", "{work}/stock", "--overwrite"], ["has no .hf-posenc.json marker"]),
    # --- demo (checks only: each fails before SmolLM2 would load)
    ("demo-windows-0", ["demo", "--windows", "0", "--out", OUT], ["--windows must be an integer >= 1, got 0"]),
    ("demo-steps-neg", ["demo", "--steps", "-1", "--out", OUT], ["--steps must be an integer >= 0, got -1"]),
    ("demo-target-tokens", ["demo", "--target-tokens", "0", "--out", OUT], ["--target-tokens must be in 1..127"]),
    ("demo-lengths", ["demo", "--lengths", "-5", "--out", OUT], ["lengths must be positive integers"]),
    ("demo-recipe", ["demo", "--recipe", "{work}/nowhere.yaml", "--out", OUT], ["--recipe", "is neither a recipe file nor a shipped recipe", "--steps 0"]),
    ("demo-recipe-scheme", ["demo", "--recipe", "{work}/recipes/rope.yaml", "--out", OUT], ["--recipe", "rope.yaml swaps to 'rope'; the demo recovers alibi"]),
    ("demo-recipe-invalid", ["demo", "--recipe", "{work}/recipes/invalid.yaml", "--out", OUT], ["invalid.yaml: line 5, column 1"]),
    ("demo-model", ["demo", "--model", "{work}/nowhere", "--steps", "0", "--out", OUT], ["--model: ", "is not a model folder"]),
    ("demo-out-stock", ["demo", "--out", "{work}/stock", "--overwrite", "--steps", "0"], ["has no .hf-posenc.json marker"]),
    ("demo-out-is-model", ["demo", "--model", "{work}/tiny", "--steps", "0", "--out", "{work}/tiny", "--overwrite"], ["is the source (--model"]),
    # --- train: recipe files
    ("train-missing-recipe", ["train", "{work}/nowhere.yaml"], ["recipe", "nowhere.yaml' not found", "give a recipe YAML file"]),
    ("train-recipe-folder", ["train", "{work}/recipes/folder.yaml"], ["it is a folder; give the YAML file"]),
    ("train-invalid-yaml", ["train", "{work}/recipes/invalid.yaml"], ["invalid.yaml: line 5, column 1: the recipe is not valid YAML", "expected ',' or ']'"]),
    ("train-tabs-yaml", ["train", "{work}/recipes/tabs.yaml"], ["tabs.yaml: line 2, column 1: the recipe is not valid YAML"]),
    ("train-binary", ["train", "{work}/recipes/binary.yaml"], ["binary.yaml: the recipe is not a text file"]),
    ("train-list", ["train", "{work}/recipes/list.yaml"], ["list.yaml: a recipe is a mapping of fields (model_name_or_path"]),
    # --- train: fields
    ("train-old-format", ["train", "{work}/recipes/old-format.yaml"], ["the sections of the format before", "model.name_or_path -> model_name_or_path", "training.lr -> learning_rate"]),
    ("train-unknown-field", ["train", "{work}/recipes/unknown-field.yaml"], ["unknown field 'max_step'", "did you mean 'max_steps'", "TrainingArguments"]),
    ("train-missing-output", ["train", "{work}/recipes/missing-output.yaml"], ["output_dir: required"]),
    ("train-type-int", ["train", "{work}/recipes/type-steps.yaml"], ["max_steps: invalid int value: 'ten'"]),
    ("train-type-float", ["train", "{work}/recipes/type-lr.yaml"], ["learning_rate: invalid float value: 'fast'"]),
    ("train-lr-negative", ["train", "{work}/recipes/lr-negative.yaml"], ["learning_rate: must be > 0, got -1.0"]),
    ("train-lr-inf", ["train", "{work}/recipes/lr-inf.yaml"], ["learning_rate: must be a finite number, got inf"]),
    ("train-dropout", ["train", "{work}/recipes/dropout.yaml"], ["lora_dropout: must be in [0, 1), got 1.5"]),
    ("train-task", ["train", "{work}/recipes/task.yaml"], ["task: expected one of", "translation", "causal_lm"]),
    ("train-batch-split", ["train", "{work}/recipes/batch-split.yaml"], ["global_batch_size: 3 is not a multiple of per_device_train_batch_size=2"]),
    ("train-eval-samples", ["train", "{work}/recipes/eval-samples.yaml"], ["max_eval_samples: must be >= 1 or null, got 0"]),
    ("train-seed", ["train", "{work}/recipes/seed.yaml"], ["seed: must be >= 0, got -1"]),
    ("train-float-for-int", ["train", "{work}/recipes/depth-nan.yaml"], ["eval_max_windows: expected int or null, got nan"]),
    ("eval-depths-nan", ["eval", "--model", "{work}/tiny", "--passkey.depths", "0,nan", "--out", OUT], ["--passkey.depths", "in [0, 1]", "nan"]),
    ("train-alpha", ["train", "{work}/recipes/alpha.yaml"], ["lora_alpha: must be > 0, got 0.0"]),
    ("train-trainable", ["train", "{work}/recipes/trainable.yaml"], ["trainable: unknown group(s) ['everything']", "allowed: posenc, embeddings"]),
    ("train-scheme", ["train", "{work}/recipes/scheme.yaml"], ["scheme: unknown scheme 'rotary'", "available schemes"]),
    ("train-scheme-option", ["train", "{work}/recipes/scheme-option.yaml"], ["scheme: scheme 'yarn': factor must be a number >= 1, got 'big'"]),
    ("train-options-string", ["train", "{work}/recipes/options-string.yaml"], ["scheme_options: must be a mapping such as {factor: 4}"]),
    ("train-options-no-scheme", ["train", "{work}/recipes/options-no-scheme.yaml"], ["scheme_options or scheme_layers given without a scheme"]),
    ("train-layers-out-of-range", ["train", "{work}/recipes/layers-out-of-range.yaml"], ["scheme_layers", "layers [9] are not attention layers", "2 layers"]),
    ("train-layers-input-site", ["train", "{work}/recipes/layers-input-site.yaml"], ["scheme_layers", "'sinusoidal' in layers [1]", "token embeddings"]),
    ("train-layers-override", ["train", "{work}/recipes/ok.yaml", "--scheme", "nope", "--scheme_layers", "[1, one]"], ["layers must be a non-empty list of layer indices", "got [1, 'one']"]),
    ("train-unsupported", ["train", "{work}/recipes/unsupported.yaml"], ["scheme: 'bert' does not support 'xpos'", "supported: alibi"]),
    ("train-missing-model", ["train", "{work}/recipes/missing-model.yaml"], ["model_name_or_path", "is not a model folder"]),
    ("train-truncated-model", ["train", "{work}/recipes/truncated-model.yaml"], ["model_name_or_path", "cannot read the weights"]),
    # --- train: overrides and flags
    ("train-override-unknown", ["train", "{work}/recipes/ok.yaml", "--nosuch", "1"], ["override: unknown field 'nosuch'"]),
    ("train-override-section", ["train", "{work}/recipes/ok.yaml", "--training.lr", "1"], ["override --training.lr: fields have no sections now; use --learning_rate"]),
    ("train-override-type", ["train", "{work}/recipes/ok.yaml", "--max_steps", "many"], ["max_steps", "many"]),
    ("train-override-misspelt", ["train", "{work}/recipes/ok.yaml", "--lerning_rate", "2"], ["unknown field 'lerning_rate'", "did you mean 'learning_rate'"]),
    ("train-override-bare", ["train", "{work}/recipes/ok.yaml", "--learning_rate", "1", "2"], ["unrecognized arguments: 2"]),
    ("train-accelerate-config", ["train", "{work}/recipes/ok.yaml", "--accelerate-config", "nosuch"], ["accelerate config 'nosuch' not found", "shipped: cpu, cpu_2proc"]),
    ("train-accelerate-yaml", ["train", "{work}/recipes/ok.yaml", "--accelerate-config", "{work}/accel-bad.yaml"], ["accel-bad.yaml: line 2, column 1", "not valid YAML"]),
    ("train-resume-overwrite", ["train", "{work}/recipes/ok.yaml", "--resume", "--overwrite"], ["--resume and --overwrite exclude each other"]),
    ("train-resume-nothing", ["train", "{work}/recipes/ok.yaml", "--resume"], ["has no checkpoint to continue from", "--resume auto"]),
    ("train-resume-value", ["train", "{work}/recipes/ok.yaml", "--resume", "always"], ["argument --resume: invalid choice: 'always'"]),
    # --- train: folders
    ("train-out-is-model", ["train", "{work}/recipes/out-is-model.yaml", "--overwrite"], ["output_dir", "is the source (model_name_or_path"]),
    ("train-out-in-model", ["train", "{work}/recipes/out-in-model.yaml"], ["output_dir", "is inside the source (model_name_or_path"]),
    ("train-out-holds-data", ["train", "{work}/recipes/out-holds-data.yaml", "--overwrite"], ["output_dir", "holds the source (dataset_name"]),
    ("train-out-stock", ["train", "{work}/recipes/out-stock.yaml", "--overwrite"], ["output_dir", "is not empty and holds no hf-posenc run"]),
    ("train-out-stock-run", ["train", "{work}/recipes/out-stock-run.yaml", "--overwrite"], ["output_dir", "has no .hf-posenc.json marker", "delete it yourself"]),
    ("train-out-file", ["train", "{work}/recipes/out-file.yaml"], ["output_dir", "is a file; give a folder"]),
    # --- card
    ("card-missing", ["card", "{work}/nowhere"], ["DIR", "is not a folder"]),
    ("card-repo-id", ["card", "{work}/tiny", "--repo-id", "me//x"], ["--repo-id 'me//x' is not a Hub repo id"]),
    ("card-base-model", ["card", "{work}/tiny", "--base-model", "a b"], ["--base-model 'a b' is not a Hub repo id"]),
    # --- push
    ("push-repo-id-slashes", ["push", "{work}/tiny", "me//x", "--dry-run", OUT], ["REPO_ID 'me//x' is not a Hub repo id", "'owner/name'"]),
    ("push-repo-id-space", ["push", "{work}/tiny", "me/my model", "--dry-run", OUT], ["REPO_ID 'me/my model' is not a Hub repo id"]),
    ("push-repo-id-dots", ["push", "{work}/tiny", "me/..x", "--dry-run", OUT], ["REPO_ID 'me/..x' is not a Hub repo id"]),
    ("push-missing-dir", ["push", "{work}/nowhere", "me/x", "--dry-run", OUT], ["DIR", "is not a folder"]),
    ("push-no-config", ["push", "{work}/no-config", "me/x", "--dry-run", OUT], ["has no config.json"]),
    ("push-truncated", ["push", "{work}/truncated", "me/x", "--dry-run", OUT], ["cannot read the weights"]),
    ("push-dry-run-inside", ["push", "{work}/tiny", "me/x", "--dry-run", "{work}/tiny/staged"], ["--dry-run", "is inside the source (DIR"]),
    ("push-dry-run-exists", ["push", "{work}/tiny", "me/x", "--dry-run", "{work}/existing"], ["--dry-run", "already exists; give a new folder"]),
    ("push-dry-run-file", ["push", "{work}/tiny", "me/x", "--dry-run", "{work}/afile"], ["already exists"]),
    # --- export
    ("export-missing", ["export", "{work}/nowhere", "--gguf", "{work}/m.gguf"], ["MODEL", "is not a model folder"]),
    ("export-no-config", ["export", "{work}/no-config", "--gguf", "{work}/m.gguf"], ["MODEL", "has no config.json"]),
    ("export-exists", ["export", "{work}/tiny", "--gguf", "{work}/afile"], ["--gguf", "afile exists", "--overwrite"]),
    ("export-folder", ["export", "{work}/tiny", "--gguf", "{work}/existing"], ["--gguf", "is a folder"]),
    ("export-dtype", ["export", "{work}/tiny", "--gguf", "{work}/m.gguf", "--dtype", "q4"], ["invalid choice: 'q4'"]),
    ("export-architecture", ["export", "{work}/tiny", "--gguf", "{work}/m.gguf"], ["cannot export GPT2LMHeadModel",
                                                                                "LlamaForCausalLM"]),
]


@pytest.mark.parametrize("argv,parts", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_mistake_exits_2_in_one_line_before_any_load(work, loads, capsys, argv, parts):
    argv = [a.replace("{work}", str(work)) for a in argv]
    parts = [p.replace("{work}", str(work)) for p in parts]
    before = snapshot(work)
    capsys.readouterr()
    try:
        code = cli.main(argv)
    except SystemExit as stop:  # argparse's own errors
        code = stop.code
    err = capsys.readouterr().err
    assert code == 2, (argv, err)
    line = err.strip().splitlines()[-1]
    if "usage:" not in err:  # argparse prints its usage line first; everything else is one line
        assert err.count("\n") == 1, err
    for part in parts:
        assert part in line, (part, line)
    assert loads == [], f"weights were loaded: {loads}"
    assert snapshot(work) == before, "a refused command wrote or changed files"


def test_the_suite_has_80_cases_over_every_subcommand():
    commands = {argv[0] for _, argv, _ in CASES}
    assert len(CASES) >= 80 and set(cli.SUBCOMMANDS) <= commands | {"list"}, (len(CASES), commands)


# ---------------------------------------------------------------- usage errors never import torch

PROBE = ("import sys\nfrom hf_posenc.cli import main\n"
         "try:\n    code = main(sys.argv[1:])\nexcept SystemExit as stop:\n    code = stop.code\n"
         "print('EXIT', code, 'torch' in sys.modules, 'transformers' in sys.modules, file=sys.stderr)")
TORCH_FREE = {  # mistakes decided before torch (and transformers) are imported, on this branch alone
    "bad-flag": ["patch", "m", "rope", "--out", "o", "--bogus"],
    "no-out": ["patch", "m", "rope"],
    "max-windows": ["eval", "--model", "m", "--perplexity.max-windows", "0", "--out", "o"],
    "examples": ["eval", "--model", "m", "--synthetic.examples", "0", "--out", "o"],
    "accelerate-config": ["eval", "--model", "m", "--accelerate-config", "nosuch", "--out", "o"],
    "top-k": ["inspect", "m", "--top-k", "-1", "--out", "o"],
    "seeds": ["inspect", "m", "--seeds", "-2", "--out", "o"],
    "repo-id": ["push", ".", "me//x"],
    "push-missing": ["push", "nowhere", "me/x"],
    "card-missing": ["card", "nowhere"],
    "demo-windows": ["demo", "--windows", "0"],
    "recipe-missing": ["train", "nowhere.yaml"],
    "recipe-yaml": ["train", "invalid.yaml"],
    "recipe-field": ["train", "unknown-field.yaml"],
    "recipe-old-format": ["train", "old-format.yaml"],
    "recipe-override": ["train", "ok.yaml", "--training.lr", "1"],
    "recipe-type": ["train", "type-steps.yaml"],  # TrainingArguments' types read from its source, torch-free
    "out-is-a-file": ["eval", "--model", "m", "--out", "afile"],
    # scheme names and option domains: PosEncConfig reads them without torch (hf_posenc/domains.py)
    "unknown-scheme": ["patch", "m", "nosuch", "--out", "o"],
    "opt-type": ["patch", "m", "yarn", "--opt", "factor=abc", "--out", "o"],
    "opt-range": ["eval", "--model", "m", "--patch", "rope", "--opt", "theta=-1", "--out", "o"],
    "opt-unknown": ["patch", "m", "alibi", "--opt", "slopes=1", "--out", "o"],
    # suite, RULER task and perplexity-mode names: hf_posenc.evaluation.names, torch-free
    "unknown-suite": ["eval", "--model", "m", "--suite", "nosuch", "--out", "o"],
    "unknown-ruler-task": ["eval", "--model", "m", "--suite", "ruler:nosuch", "--out", "o"],
    "unknown-ppl-mode": ["eval", "--model", "m", "--perplexity.mode", "nosuch", "--out", "o"],
}


def _probe(work: Path, argv: list[str]) -> tuple[int, bool, bool, str]:
    cwd = work / "recipes"
    proc = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=120, cwd=cwd)
    *message, last = proc.stderr.strip().splitlines()
    _, code, torch_loaded, transformers_loaded = last.split()
    return int(code), torch_loaded == "True", transformers_loaded == "True", "\n".join(message)


@pytest.mark.parametrize("argv", TORCH_FREE.values(), ids=TORCH_FREE.keys())
def test_usage_errors_are_decided_without_importing_torch(work, argv):
    code, torch_loaded, transformers_loaded, message = _probe(work, argv)
    assert code == 2 and message, message
    assert not torch_loaded, f"{argv}: torch was imported before refusing ({message})"
    assert not transformers_loaded, f"{argv}: transformers imported: {transformers_loaded}"



# ---------------------------------------------------------------- what --overwrite may replace


def test_every_folder_hf_posenc_writes_is_marked_and_only_those_are_replaced(work, tmp_path, capsys):
    out = tmp_path / "patched"
    assert cli.main(["patch", str(work / "tiny"), "alibi", "--out", str(out)]) == 0
    marker = folders.read_marker(out)
    assert marker["command"] == "patch" and marker["sources"] == [str(work / "tiny")]
    assert marker["version"] == hp.__version__ and marker["written"].endswith("+00:00")
    # a marked folder is replaced whole by --overwrite (a re-run), a foreign one never
    (out / "stale.txt").write_text("from the earlier run")
    assert cli.main(["patch", str(work / "tiny"), "rope", "--out", str(out), "--overwrite"]) == 0
    assert not (out / "stale.txt").exists() and hp.from_pretrained(str(out)).config.posenc["scheme"] == "rope"
    # save_pretrained of a patched model marks its folder; plain transformers' save does not
    saved = tmp_path / "saved"
    hp.patch(tiny_model("gpt2"), "alibi").save_pretrained(saved)
    assert folders.read_marker(saved)["command"] == "save_pretrained"
    plain = tmp_path / "plain"
    tiny_model("gpt2").save_pretrained(plain)
    assert not (plain / folders.MARKER).exists()
    # push --dry-run marks what it stages, but the marker (local paths) is never part of the repo itself
    staged = tmp_path / "staged"
    capsys.readouterr()
    assert cli.main(["push", str(out), "me/x", "--dry-run", str(staged)]) == 0
    assert folders.read_marker(staged)["command"] == "push --dry-run"
    from hf_posenc import hub

    exported = hub.export(out, tmp_path / "exported")
    assert not (exported / folders.MARKER).exists() and (exported / "config.json").is_file()


def test_rerunning_into_a_marked_folder_is_allowed_and_a_changed_folder_is_not(tmp_path):
    demo = folders.clear_out(tmp_path / "demo", "demo", ["smollm2"])  # what `make demo` does each run
    (demo / "results.json").write_text("{}")
    assert folders.check_out(str(demo), overwrite=True, command="demo") == demo  # the next `make demo` may replace it
    assert folders.clear_out(demo, "demo") == demo and sorted(p.name for p in demo.iterdir()) == [folders.MARKER]
    (demo / folders.MARKER).unlink()  # the marker went away between the check and the work: still refused
    (demo / "mine.txt").write_text("keep")
    with pytest.raises(hp.PosEncError, match="has no .hf-posenc.json marker; refusing to replace it"):
        folders.clear_out(demo, "demo")
    assert (demo / "mine.txt").read_text() == "keep"


def test_train_marks_its_run_and_overwrites_only_a_marked_run(work, tmp_path):
    from hf_posenc.train import load_recipe
    from hf_posenc.train.run_folder import RUN_FILE, check_output

    run = tmp_path / "run"
    recipe = load_recipe(_recipe(tmp_path, "r", output_dir=str(run)))
    run.mkdir()
    (run / RUN_FILE).write_text(json.dumps({"recipe": recipe.to_dict()}))  # a run of an hf-posenc before markers
    with pytest.raises(hp.PosEncError, match="has no .hf-posenc.json marker"):
        check_output(recipe, False, True)
    with pytest.raises(hp.PosEncError, match="already holds a run, with no checkpoint to continue from; pass --overwrite"):
        check_output(recipe, "auto", False)  # no checkpoint to continue and no marker: not replaced either
    folders.mark(run, "train")
    assert check_output(recipe, False, True) == (False, True)
    with pytest.raises(hp.PosEncError, match="pass --overwrite"):
        check_output(recipe, "auto", False)  # a finished run is replaced only when asked
    folders.mark(run, "train", complete=False)
    assert check_output(recipe, "auto", False) == (False, True)  # one stopped before its first checkpoint: started over
