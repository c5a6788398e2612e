"""`--overwrite` against every kind of folder (issue 38): a command replaces only a folder of its own kind that it
wrote itself; any other marked folder -- above all one holding a model or checkpoints -- is refused in the check
stage (exit 2, within a second, no weights loaded), naming both kinds and a way out, with every file's hash
unchanged. Once an `eval --overwrite` replaced a patched model with results.json.

Each folder is written by the real writer where that is cheap (patch, save_pretrained, eval, eval --compare,
inspect, push --dry-run, recipes copy) and, for train and demo, laid out as they lay it out (marked through the
same `folders.clear_out` / `folders.mark`), so the matrix stays a few seconds.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path

import pytest
import transformers
import yaml
from tokenizers import Tokenizer, models, pre_tokenizers

import hf_posenc as hp
from conftest import TINY, tiny_model
from hf_posenc import cli, folders

SMALL_EVAL = ["--suite", "ppl", "--lengths", "16,32", "--perplexity.max-windows", "1", "--no-baseline"]
# each command that takes --overwrite -> its argv, writing to {out}
COMMANDS: dict[str, list[str]] = {
    "patch": ["patch", "{tiny}", "alibi", "--out", "{out}", "--overwrite"],
    "eval": ["eval", "--model", "{tiny}", *SMALL_EVAL, "--out", "{out}", "--overwrite"],
    "eval --compare": ["eval", "--compare", "{results}", "--out", "{out}", "--overwrite"],
    "inspect": ["inspect", "{tiny}", "--out", "{out}", "--overwrite"],
    "demo": ["demo", "--model", "{tiny}", "--steps", "0", "--lengths", "16,32", "--target-tokens", "8",
             "--out", "{out}", "--overwrite"],
    "train": ["train", "{recipe}", "--overwrite"],
}


def _save_tiny(folder: Path) -> Path:
    tiny_model("gpt2").save_pretrained(folder)
    backend = Tokenizer(models.WordLevel({f"w{i}": i for i in range(TINY["vocab"])}, unk_token="w0"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="w0").save_pretrained(folder)
    return folder


def _run(argv: list[str]) -> int:
    assert cli.main(argv) == 0, argv
    return 0


def _train_run(folder: Path, tiny: Path) -> None:
    """A run folder as `hf-posenc train` leaves it: marked, run.json, the model, a checkpoint."""
    folders.clear_out(folder, "train", [str(tiny)])
    for file in tiny.iterdir():
        shutil.copyfile(file, folder / file.name)
    (folder / "run.json").write_text(json.dumps({"recipe": {}}))
    checkpoint = folder / "checkpoints" / "checkpoint-1"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text("{}")
    shutil.copyfile(tiny / "model.safetensors", checkpoint / "model.safetensors")


def _demo(folder: Path, tiny: Path, results: Path) -> None:
    """A demo folder as `hf-posenc demo` leaves it: results, and the recovered model's run inside."""
    folders.clear_out(folder, "demo", ["smollm2"])
    shutil.copyfile(results, folder / "results.json")
    _train_run(folder / "smollm2-alibi-recovered", tiny)


def _legacy(folder: Path, command: str, content: Path) -> None:
    """A folder an hf-posenc from before kinds marked: the marker names the command only."""
    shutil.copytree(content, folder)
    (folder / folders.MARKER).unlink(missing_ok=True)
    (folder / folders.MARKER).write_text(json.dumps({"tool": "hf-posenc", "version": "0.1", "command": command}))


@pytest.fixture(scope="module")
def kinds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One folder of every kind hf-posenc writes (and two legacy ones), by the name of what wrote it."""
    root = tmp_path_factory.mktemp("kinds")
    tiny = _save_tiny(root / "tiny")
    made = {name: root / name.replace(" ", "_").replace("-", "") for name in
            ("patch", "save_pretrained", "eval", "eval --compare", "inspect", "push --dry-run", "recipes copy")}
    _run(["patch", str(tiny), "alibi", "--out", str(made["patch"])])
    hp.patch(tiny_model("gpt2"), "alibi").save_pretrained(made["save_pretrained"])
    _run(["eval", "--model", str(tiny), *SMALL_EVAL, "--out", str(made["eval"])])
    results = made["eval"] / "results.json"
    _run(["eval", "--compare", str(results), "--out", str(made["eval --compare"])])
    _run(["inspect", str(tiny), "--out", str(made["inspect"])])
    _run(["push", str(made["patch"]), "me/x", "--dry-run", str(made["push --dry-run"])])
    _run(["recipes", "copy", "smollm2-135m/alibi/smoke", str(made["recipes copy"])])
    made["train"], made["demo"] = root / "train", root / "demo"
    _train_run(made["train"], tiny)
    _demo(made["demo"], tiny, results)
    made["legacy eval"], made["legacy eval holding a model"] = root / "legacy_eval", root / "legacy_model"
    _legacy(made["legacy eval"], "eval", made["eval"])
    _legacy(made["legacy eval holding a model"], "eval", made["patch"])
    return {"tiny": tiny, "results": results, **made}


# the folder -> (the command that may replace it, the kind it holds)
FOLDERS: dict[str, tuple[str, str]] = {
    "patch": ("patch", "model"), "save_pretrained": ("save_pretrained", "model"), "train": ("train", "run"),
    "demo": ("demo", "demo"), "eval": ("eval", "results"), "eval --compare": ("eval --compare", "comparison"),
    "inspect": ("inspect", "inspection"), "push --dry-run": ("push --dry-run", "staged repo"),
    "recipes copy": ("recipes copy", "recipe copy"),
    "legacy eval": ("eval", "results"),  # read by its command: results
    "legacy eval holding a model": ("nothing", "model"),  # its files are a model's, whatever the marker says
}


def test_each_writer_marks_its_kind(kinds):
    for folder, (_, kind) in FOLDERS.items():
        assert folders.kind_of(kinds[folder]) == kind, folder
        if not folder.startswith("legacy"):
            assert folders.read_marker(kinds[folder])["kind"] == kind, folder


def _hashes(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _argv(command: str, out: Path, kinds: dict[str, Path], tmp_path: Path) -> list[str]:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({
        "model_name_or_path": str(kinds["tiny"]), "dataset_name": "kjv", "seq_len": 16, "max_steps": 1,
        "global_batch_size": 1, "per_device_train_batch_size": 1, "output_dir": str(out)}))
    values = {"{tiny}": str(kinds["tiny"]), "{out}": str(out), "{results}": str(kinds["results"]),
              "{recipe}": str(recipe)}
    return [values.get(a, a) for a in COMMANDS[command]]


@pytest.mark.parametrize("folder", list(FOLDERS))
@pytest.mark.parametrize("command", list(COMMANDS))
def test_overwrite_replaces_only_its_own_kind(kinds, loads, capsys, tmp_path, command, folder):
    out = tmp_path / "out"
    shutil.copytree(kinds[folder], out)
    writer, kind = FOLDERS[folder]
    if writer == command:  # the same command's own kind: a rerun may replace it (the run itself is tested elsewhere)
        assert folders.replaceable(out, command)
        return
    before = _hashes(out)
    capsys.readouterr()
    t0 = time.perf_counter()
    code = cli.main(_argv(command, out, kinds, tmp_path))
    seconds = time.perf_counter() - t0
    err = capsys.readouterr().err
    assert code == 2, err
    wanted = folders.KINDS[command]
    for part in (f"holds {folders.KIND_NAMES[kind]}", f"replaces only {folders.KIND_NAMES[wanted]}",
                 "choose a new folder", "delete"):
        assert part in err, (part, err)
    assert _hashes(out) == before, "a refused --overwrite changed the folder"
    assert loads == [], f"weights were loaded before the refusal: {loads}"
    assert seconds < 1.0, f"refused after {seconds:.2f} s"


def test_a_model_folder_is_refused_even_when_the_marker_changed_since_the_check(kinds, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(kinds["eval"], out)
    folders.check_out(str(out), True, command="eval")
    shutil.copyfile(kinds["patch"] / "model.safetensors", out / "model.safetensors")  # a model arrived since
    before = _hashes(out)
    with pytest.raises(hp.PosEncError, match="holds a model written by `hf-posenc eval`"):
        folders.clear_out(out, "eval")
    assert _hashes(out) == before


def test_the_demo_replaces_its_own_folder_on_every_rerun(kinds, tmp_path):
    out = tmp_path / "demo"
    shutil.copytree(kinds["demo"], out)  # `make demo` runs `hf-posenc demo --out out/demo --overwrite`
    folders.check_out(str(out), True, command="demo")
    assert folders.clear_out(out, "demo") == out and folders.kind_of(out) == "demo"


def test_without_overwrite_a_folder_of_another_kind_is_not_offered_to_overwrite(kinds, capsys, tmp_path):
    out = tmp_path / "victim"
    shutil.copytree(kinds["patch"], out)  # `patch ... --out out/victim`, then `eval ... --out out/victim`
    capsys.readouterr()
    assert cli.main(_argv("eval", out, kinds, tmp_path)[:-1]) == 2  # without --overwrite
    err = capsys.readouterr().err
    assert "it holds a model written by `hf-posenc patch`" in err and "pass --overwrite" not in err, err
