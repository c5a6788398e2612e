"""The `hf-posenc` entry point as a real process: list, patch, and errors on bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast
from tokenizers import Tokenizer, models, pre_tokenizers

import hf_posenc as hp
from conftest import TINY, tiny_model
from hf_posenc import cli


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hf_posenc.cli", *args], capture_output=True, text=True, timeout=300)


def test_list_prints_the_registry_matrix():
    out = run("list", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["architectures"] == hp.list_architectures()
    assert data["matrix"]["bert"]["xpos"] is False and data["matrix"]["llama"]["yarn"] is True
    assert data["model_types"]["types"]["gemma3_text"]["sites"] == {"input": True, "qk": True, "score": True, "none": True}
    table = run("list", "--model-types").stdout
    assert "| mpt | partial | alibi | - | yes | - | yes | input: input: the config names no max_position_embeddings" in table


@pytest.fixture
def tiny_folder(tmp_path):
    model = tiny_model("gpt2")
    vocab = {f"w{i}": i for i in range(TINY["vocab"])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="w0")
    folder = tmp_path / "tiny"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_patch_saves_a_model_that_reloads_patched(tiny_folder, tmp_path):
    out = run("patch", str(tiny_folder), "rope", "--opt", "theta=100", "--out", str(tmp_path / "rope"))
    assert out.returncode == 0, out.stderr
    assert "PosEncConfig(scheme='rope', theta=100.0, partial=1.0)" in out.stdout
    reloaded = hp.from_pretrained(str(tmp_path / "rope")).eval()
    expected = hp.patch(AutoModelForCausalLM.from_pretrained(tiny_folder).eval(), "rope", theta=100.0)
    ids = torch.randint(3, TINY["vocab"], (1, 12))
    assert torch.equal(reloaded(ids).logits, expected(ids).logits)
    assert AutoTokenizer.from_pretrained(tmp_path / "rope").pad_token == "w0"


def test_patch_layers_saves_a_per_layer_patch(tiny_folder, tmp_path):
    out = run("patch", str(tiny_folder), "rope", "--layers", "1", "--out", str(tmp_path / "rope1"))
    assert out.returncode == 0, out.stderr
    reloaded = hp.from_pretrained(str(tmp_path / "rope1")).eval()
    assert hp.describe(reloaded).layers == (1,)
    expected = hp.patch(AutoModelForCausalLM.from_pretrained(tiny_folder).eval(), "rope", layers=[1])
    ids = torch.randint(3, TINY["vocab"], (1, 12))
    assert torch.equal(reloaded(ids).logits, expected(ids).logits)
    assert "| layers (the others keep the original scheme) | 1 |" in (tmp_path / "rope1" / "README.md").read_text()


@pytest.mark.parametrize("args,message", [
    (["rotary"], "unknown scheme 'rotary'; available schemes: alibi"),
    (["rope", "--opt", "theta=-1"], "theta must be a number > 0 or null, got -1"),
    (["rope", "--opt", "theta"], "--opt takes key=value, got 'theta'"),
    (["rope", "--layers", "1,x"], "--layers takes comma-separated layer indices such as 3,7,11, got '1,x'"),
    (["rope", "--layers", "5"], "layers [5] are not attention layers of this 'gpt2' model: it has 2 layers"),
    (["nope", "--layers", "1"], "cannot take scheme 'nope' in layers [1] (nothing to remove"),
])
def test_patch_errors_exit_2_with_the_reason(tiny_folder, tmp_path, args, message):
    out = run("patch", str(tiny_folder), *args, "--out", str(tmp_path / "x"))
    assert out.returncode == 2
    assert message in out.stderr
    assert not (tmp_path / "x").exists()  # nothing written for a failed patch


@pytest.mark.parametrize("command", ["list", "patch", "demo", "eval", "inspect", "train", "card", "push", "export"])
def test_every_subcommand_has_help_with_examples(command, capsys):
    from hf_posenc.cli import build_parser

    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args([command, "--help"])
    assert exit_.value.code == 0
    assert "example" in capsys.readouterr().out.lower()


# ---------------------------------------------------------------- failing clearly (issue 13)


def snapshot(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_output_folders_are_never_silently_overwritten(tiny_folder, tmp_path, capsys):
    def refused(argv: list[str], message: str) -> None:
        assert cli.main(argv) == 2, argv
        assert message in capsys.readouterr().err, argv

    out = tmp_path / "rope"
    assert cli.main(["patch", str(tiny_folder), "rope", "--out", str(out)]) == 0
    before = snapshot(out)
    refused(["patch", str(tiny_folder), "nope", "--out", str(out)],
            "is not empty; choose a new folder, or pass --overwrite")
    evaluated = tmp_path / "eval"
    assert cli.main(["eval", "--model", str(tiny_folder), "--suite", "ppl", "--lengths", "8", "--out",
                     str(evaluated)]) == 0
    results_before = (evaluated / "results.json").read_bytes()
    refused(["eval", "--model", str(out), "--suite", "ppl", "--lengths", "8", "--out", str(evaluated)], "is not empty")
    assert snapshot(out) == before and (evaluated / "results.json").read_bytes() == results_before
    # an old run folder: --overwrite replaces it whole, so no stale results sit beside the new weights
    (out / "results.json").write_text("{}")
    (out / "run.json").write_text("{}")
    assert cli.main(["patch", str(tiny_folder), "nope", "--out", str(out), "--overwrite"]) == 0
    assert not (out / "results.json").exists() and not (out / "run.json").exists()
    assert hp.from_pretrained(str(out)).config.posenc["scheme"] == "nope"
    assert "posenc-nope" in (out / "README.md").read_text()

    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep")
    refused(["patch", str(tiny_folder), "nope", "--out", str(foreign), "--overwrite"], "has no .hf-posenc.json marker, so hf-posenc did not write it")
    assert (foreign / "notes.txt").read_text() == "keep"
    refused(["patch", str(tiny_folder), "nope", "--out", str(foreign / "notes.txt")], "is a file; give a folder")
    refused(["eval", "--model", str(tiny_folder), "--out", str(foreign / "notes.txt" / "x")], "is not a writable folder")


def test_checks_come_before_the_model_loads_and_write_nothing(tiny_folder, tmp_path, capsys):
    damaged = tmp_path / "damaged"  # weights that cannot load: a check that came after loading would say so
    damaged.mkdir()
    for file in tiny_folder.iterdir():
        (damaged / file.name).write_bytes(file.read_bytes())
    weights = damaged / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    out = tmp_path / "out"
    cases = [
        (["patch", str(damaged), "yarn", "--opt", "factor=abc"], "scheme 'yarn': factor must be a number >= 1, got 'abc'"),
        (["patch", str(damaged), "yarn", "--opt", "factor=true"], "factor must be a number >= 1, got True"),
        (["patch", str(damaged), "t5", "--opt", "num_buckets=3.5"], "num_buckets must be an int >= 4 or null, got 3.5"),
        (["patch", str(damaged), "rotary"], "unknown scheme 'rotary'"),
        (["eval", "--model", str(damaged), "--patch", "alibi", "--opt", "max_bias=x"], "max_bias must be a number"),
        (["eval", "--model", str(tmp_path / "missing")], "is not a model folder, a Hub id"),
        (["eval", "--model", "./missing"], "'./missing' is not a model folder"),
        (["eval", "--model", str(damaged), "--suite", "ppl,bleu"], "unknown suite 'bleu'"),
        (["eval", "--compare", str(weights)], "not a JSON text file; give a results.json"),
        (["inspect", str(tmp_path / "missing")], "is not a model folder"),
    ]
    bert = tmp_path / "bert"
    tiny_model("bert").save_pretrained(bert)
    cases.append((["patch", str(bert), "xpos"], "cannot take scheme 'xpos'; it takes: alibi"))
    capsys.readouterr()
    for argv, message in cases:
        assert cli.main([*argv, "--out", str(out)]) == 2, argv
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, (argv, err)  # one line, no traceback
        assert not out.exists(), argv  # no stub results.json either


def test_runtime_errors_are_one_line_exit_1_and_debug_shows_the_traceback(tiny_folder, tmp_path):
    # a damaged tokenizer shows only when it loads (truncated weights are refused before, with exit 2:
    # tests/test_bad_input_cli.py)
    (tiny_folder / "tokenizer.json").write_text("{")
    proc = run("eval", "--model", str(tiny_folder), "--suite", "ppl", "--lengths", "8", "--out", str(tmp_path / "e"))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    plan, error = proc.stderr.splitlines()[:-1], proc.stderr.splitlines()[-1]  # the plan said before loading
    assert plan[0].startswith("eval: 1 row(s) x 1 cell(s)") and all(line.startswith("  ") for line in plan[1:]), plan
    assert f"cannot load the tokenizer of {str(tiny_folder)!r}" in error
    debug = run("--debug", "eval", "--model", str(tiny_folder), "--lengths", "8", "--out", str(tmp_path / "d"))
    assert debug.returncode == 1 and "Traceback (most recent call last)" in debug.stderr


def test_interrupt_says_what_was_saved_and_a_closed_pipe_is_quiet(tiny_folder, tmp_path):
    import signal
    import time

    out = tmp_path / "e"
    proc = subprocess.Popen([sys.executable, "-m", "hf_posenc.cli", "eval", "--model", str(tiny_folder), "--suite",
                             "passkey", "--lengths", "64", "--passkey.trials", "20000", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while not (out / "results.json").exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert f"interrupted; the suites that finished are in {out / 'results.json'}" in err and "Traceback" not in err

    piped = subprocess.Popen([sys.executable, "-m", "hf_posenc.cli", "list", "--json"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    piped.stdout.close()  # `| head` that has already gone
    assert piped.wait(timeout=60) == 141 and piped.stderr.read() == b""


def test_push_without_a_token_names_hf_token_and_hf_auth_login(tiny_folder, tmp_path, monkeypatch):
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")}
    env["HF_HOME"] = str(tmp_path / "hf-home")  # no token stored by `hf auth login` either
    folder = tmp_path / "patched"
    hp.patch(tiny_model("gpt2"), "rope").save_pretrained(folder)
    proc = subprocess.run([sys.executable, "-m", "hf_posenc.cli", "push", str(folder), "me/x"], capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 2 and "HF_TOKEN" in proc.stderr and "hf auth login" in proc.stderr
    # the library says the same when huggingface_hub finds no token (its LocalTokenNotFoundError, before any request)
    import huggingface_hub

    from hf_posenc import hub

    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # nothing is sent without a token
    before = snapshot(folder)
    with pytest.raises(hp.PosEncError, match="HF_TOKEN.*hf auth login.*local folder is unchanged"):
        hub.push(folder, "me/x")
    assert snapshot(folder) == before


def test_compare_refuses_results_measured_differently(tmp_path):
    from hf_posenc import results

    paths = []
    for name, dtype in (("a", "float32"), ("b", "bfloat16"), ("c", "float32")):
        run_ = results.Run(f"model {name}", metrics={"perplexity": {"64": {"perplexity": 10.0}}})
        record = results.Results("eval", name, runs=[run_], settings={"text": "kjv", "dtype": dtype, "max_windows": 4})
        paths.append(str(record.save(tmp_path / f"{name}.json", complete=True)))
    assert cli.main(["eval", "--compare", paths[0], paths[2], "--out", str(tmp_path / "same")]) == 0
    assert cli.main(["eval", "--compare", *paths, "--out", str(tmp_path / "mixed")]) == 2
    assert not (tmp_path / "mixed").exists()
    assert cli.main(["eval", "--compare", *paths, "--mixed", "--out", str(tmp_path / "mixed")]) == 0
    table = (tmp_path / "mixed" / "compare.md").read_text()
    assert "| model b [2] |" in table and f"[2] {paths[1]}: dtype=bfloat16" in table


def test_help_and_list_import_no_torch():
    """What keeps `hf-posenc --help` and `hf-posenc list` under a second: neither imports torch."""
    code = ("import sys\nfrom hf_posenc.cli import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "print('torch' in sys.modules, 'transformers' in sys.modules, file=sys.stderr)")
    for argv in (["--help"], ["list"], ["list", "--json"], ["eval", "--help"]):
        proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60)
        assert proc.stderr.strip().endswith("False False"), (argv, proc.stderr)


def test_the_list_snapshot_is_the_registry():
    from hf_posenc import catalog
    from hf_posenc.paths import SNAPSHOT

    assert json.loads(SNAPSHOT.read_text()) == json.loads(json.dumps(catalog.snapshot())), (
        "a scheme or adapter changed: refresh with python -c 'import hf_posenc.catalog as c; c.write_snapshot()'")
