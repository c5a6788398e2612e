"""Evaluation over several processes: 2 CPU processes (gloo) give the one-process results, in one file.

Also the placement of big models (`device_map`), and how `hf-posenc eval --accelerate-config` hands its
options to the processes it launches.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import tiny_model
from test_evaluation import char_tokenizer

import hf_posenc
from hf_posenc import cli, evaluation, loading, results
from hf_posenc.cli import eval_

TESTS = Path(__file__).parent
REPO = TESTS.parent
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun(args: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    """tests/distributed_worker.py ARGS on 2 CPU processes over gloo."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
               str(free_port()), str(TESTS / "distributed_worker.py"), *args]
    return subprocess.run(command, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("tiny") / "llama"
    tiny_model("llama").save_pretrained(folder)
    char_tokenizer().save_pretrained(folder)
    return str(folder)


@pytest.mark.slow
def test_scores_split_over_two_processes_equal_one_process(tmp_path, model_dir):
    import distributed_worker

    (tmp_path / "one").mkdir()
    one = json.loads(json.dumps(distributed_worker.split(0, 1, tmp_path / "one" / "report.json", model_dir)))
    proc = torchrun(["split", str(tmp_path / "report.json"), model_dir])
    assert proc.returncode == 0, proc.stderr[-3000:]
    two = json.loads((tmp_path / "report.json").read_text())
    assert two["world"] == 2
    for n in (0, 1, 5, 6):
        assert two[f"split{n}"] == one[f"split{n}"] == [2 * i for i in range(n)]
    # contiguous blocks, padded with the last item: both processes score as many items, every time
    assert two["calls"] == [[[], [0], [0, 1, 2], [0, 1, 2]], [[], [0], [3, 4, 4], [3, 4, 5]]]
    assert two["first"] == "01"  # main_process_first: rank 0 ran the block before rank 1
    # windows of several lengths, overlapping (stride 40), 2 per forward, 5 split 3 + 2
    for length, cell in one["perplexity"].items():
        assert cell["windows"] == 5 and cell["tokens"] == two["perplexity"][length]["tokens"]
        assert two["perplexity"][length]["loss"] == pytest.approx(cell["loss"], rel=1e-6)
    assert two["passkey"] == one["passkey"]
    assert two["answers"] == one["answers"] and len(set(one["answers"])) > 1  # in prompt order


@pytest.mark.slow
def test_eval_command_on_two_processes_writes_the_one_process_results(tmp_path, model_dir):
    argv = ["eval", "--model", model_dir, "--patch", "t5", "--opt", "init_std=0.5", "--suite", "ppl,passkey,copy",
            "--lengths", "48,400", "--perplexity.max-windows", "5", "--batch-size", "2", "--passkey.depths", "0,1", "--passkey.trials", "2",
            "--synthetic.task-lengths", "2", "--synthetic.examples", "3", "--no-baseline"]
    assert cli.main([*argv, "--out", str(tmp_path / "one")]) == 0
    code = "import sys; from hf_posenc.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.run([sys.executable, "-c", code, *argv, "--out", str(tmp_path / "two"), "--accelerate-config",
                           "cpu_2proc"], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 process(es)" in proc.stdout
    one, two = results.load(tmp_path / "one" / "results.json"), results.load(tmp_path / "two" / "results.json")
    assert one.details["processes"] == 1 and two.details["processes"] == 2
    assert two.complete and two.settings == one.settings and two.model == one.model
    (run1,), (run2,) = one.runs, two.runs
    for record in (one, two):  # the first process's peak, a real number of megabytes
        assert record.details["peak_memory_mb"].keys() == {run1.label}
        assert 50 < record.details["peak_memory_mb"][run1.label] < 24 * 2**10
    assert (run2.label, run2.scheme, run2.options, run2.posenc) == (run1.label, run1.scheme, run1.options, run1.posenc)
    assert run2.metrics.keys() == run1.metrics.keys() == {"perplexity", "passkey", "copy"}
    for length, cell in run1.metrics["perplexity"].items():
        assert {k: v for k, v in run2.metrics["perplexity"][length].items() if k not in ("perplexity", "loss")} == \
               {k: v for k, v in cell.items() if k not in ("perplexity", "loss")}
        assert run2.metrics["perplexity"][length]["perplexity"] == pytest.approx(cell["perplexity"], rel=1e-6)
    assert run2.metrics["passkey"] == run1.metrics["passkey"] and run2.metrics["copy"] == run1.metrics["copy"]
    # one writer: the same files as the one-process run, nothing left half-written
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == sorted(p.name for p in (tmp_path / "one").iterdir())


def test_options_reach_the_launched_processes_unchanged():
    parser = argparse.ArgumentParser()
    eval_.make_parser(parser)
    argv = ["--model", "smollm2", "--patch", "yarn", "--opt", "factor=2", "--opt", "beta_fast=16", "--suite", "ppl",
            "--lengths", "64,128", "--perplexity.text-config", "x", "--compare", "a.json", "b.json", "--dtype", "bfloat16",
            "--out", "out/x", "--accelerate-config", "cpu_2proc"]
    args = parser.parse_args(argv)
    forwarded = eval_._argv(args)
    assert "--accelerate-config" not in forwarded and "cpu_2proc" not in forwarded
    again = parser.parse_args(forwarded)
    # the folder is cleared once before the launch, so the processes take it with --overwrite
    assert {**vars(again), "accelerate_config": "cpu_2proc", "overwrite": False} == vars(args)
    assert again.overwrite
    args.lengths = [64, 128]  # as `check` leaves a comma list
    assert parser.parse_args(eval_._argv(args)).lengths == "64,128"


def test_big_models_are_spread_by_device_map_auto_only_where_an_accelerator_is(monkeypatch):
    assert loading.inference_device_map() is None  # this CPU-only machine: loaded as transformers does
    assert loading.inference_device_map(torch.device("cpu")) is None
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda *a, **k: torch.device("cuda"))
    assert loading.inference_device_map() == "auto"
    # one process of several: a whole copy on its own device
    assert loading.inference_device_map(torch.device("cuda", 1)) == {"": torch.device("cuda", 1)}


def test_a_patched_model_loads_spread_by_device_map_auto(tmp_path):
    torch.manual_seed(0)
    model = hf_posenc.patch(tiny_model("llama"), "t5", init_std=0.5)
    model.save_pretrained(tmp_path / "t5")
    # no accelerator here: cap the CPU so that accelerate's "auto" map offloads the layers and the head to disk
    spread = loading.load_model(str(tmp_path / "t5"), device_map="auto", max_memory={"cpu": 200_000},
                                offload_folder=str(tmp_path / "offload"))
    assert "disk" in spread.hf_device_map.values() and hf_posenc.describe(spread).scheme == "t5"
    ids = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(spread(ids).logits, model(ids).logits, rtol=0, atol=1e-6)
    text = torch.randint(0, 128, (200,), generator=torch.Generator().manual_seed(2))
    assert evaluation.perplexity_by_length(spread, text, [50], max_windows=3) == \
           evaluation.perplexity_by_length(model, text, [50], max_windows=3)


@pytest.mark.slow
def test_the_original_model_row_over_two_processes_equals_one_process(tmp_path, model_dir):
    folder = tmp_path / "llama-alibi"
    assert cli.main(["patch", model_dir, "alibi", "--out", str(folder)]) == 0  # its marker names model_dir
    argv = ["eval", "--model", str(folder), "--suite", "ppl", "--lengths", "48,96", "--perplexity.max-windows", "3"]
    assert cli.main([*argv, "--out", str(tmp_path / "one")]) == 0
    code = "import sys; from hf_posenc.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.run([sys.executable, "-c", code, *argv, "--out", str(tmp_path / "two"), "--accelerate-config",
                           "cpu_2proc"], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    one, two = results.load(tmp_path / "one" / "results.json"), results.load(tmp_path / "two" / "results.json")
    labels = ["llama-alibi (as loaded)", "llama-alibi (its own weights, rope positions) = llama (original model)"]
    assert [run.label for run in one.runs] == [run.label for run in two.runs] == labels
    for run1, run2 in zip(one.runs, two.runs):
        for length, cell in run1.metrics["perplexity"].items():
            assert run2.metrics["perplexity"][length]["perplexity"] == pytest.approx(cell["perplexity"], rel=1e-6)
