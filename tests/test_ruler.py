"""RULER in `hf-posenc eval` (through lm-eval's own generators and scorer, offline) and the 95% Wilson
intervals every reported rate carries."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import tiny_model
from hf_posenc import PosEncError, cli, results
from hf_posenc.evaluation.names import RULER_TASKS
from hf_posenc.evaluation.suite import registered_tables
from hf_posenc.evaluation import SuiteSettings, compare, run_suites
from hf_posenc.evaluation import ruler as ruler_mod
from hf_posenc.evaluation.suite import parse_suites
from hf_posenc.evaluation.suites.ruler import ruler_tasks
from hf_posenc.stats import intervals_overlap, rate_fields, wilson
from integration_support import char_tokenizer, save_tiny

# ---------------------------------------------------------------- Wilson intervals, by hand

# (successes, n) -> interval from the closed form with z = 1.96 worked by hand (Wilson 1927):
# 0/10: (0, z^2/(n+z^2)) = (0, 3.8415/13.8415); n/n mirrors it; 5/10 and 10/12 as in Newcombe 1998, table I style.
HAND = {(0, 10): (0.0, 0.2775), (10, 10): (0.7225, 1.0), (5, 10): (0.2366, 0.7634), (10, 12): (0.5520, 0.9530),
        (0, 1): (0.0, 0.7935), (1, 20): (0.0089, 0.2361)}


@pytest.mark.parametrize("k,n", list(HAND))
def test_wilson_matches_hand_computed_values(k, n):
    low, high = wilson(k, n)
    assert (round(low, 4), round(high, 4)) == HAND[(k, n)]


def test_wilson_refuses_impossible_counts_and_rates_print_with_n():
    for k, n in [(1, 0), (-1, 5), (6, 5)]:
        with pytest.raises(ValueError):
            wilson(k, n)
    cell = {"accuracy": 10 / 12, **rate_fields(10, 12)}
    assert results.format_rate(cell["accuracy"], cell["n"], cell["low"], cell["high"]) == "0.83 [0.55, 0.95] (n=12)"
    run = results.Run("m")
    run.put("passkey", 1024, cell)
    assert "| m | passkey accuracy @ 1024 tokens | 0.83 [0.55, 0.95] (n=12) |" in results.markdown([run], registered_tables())


def test_compare_says_whether_intervals_overlap(tmp_path):
    paths = []
    for name, hits in [("a", 18), ("b", 4), ("c", 15)]:
        record = results.Results("eval", name, settings={"suite": ["passkey"], "depths": [0.5], "trials": 20,
                                                          "seed": 0, "dtype": "float32"}, format=3)  # as format 3 wrote
        run = results.Run(name)
        run.put("passkey", 1024, {"accuracy": hits / 20, "trials": 20, **rate_fields(hits, 20)})
        record.runs.append(run)
        paths.append(record.save(tmp_path / f"{name}.json", complete=True))
    table = compare(paths, tmp_path / "cmp")
    assert ("passkey accuracy @ 1024 tokens: a 0.90 [0.70, 0.97] (n=20) vs b 0.20 [0.08, 0.42] (n=20): "
            "intervals apart: they differ (95%)") in table
    assert ("a 0.90 [0.70, 0.97] (n=20) vs c 0.75 [0.53, 0.89] (n=20): intervals overlap: not shown to differ"
            in table)
    assert intervals_overlap((0.1, 0.2), (0.2, 0.3)) and not intervals_overlap((0.1, 0.2), (0.21, 0.3))
    assert (tmp_path / "cmp" / "compare.md").read_text().strip() == table.strip()


# ---------------------------------------------------------------- suite names


def test_ruler_suite_names_parse_and_mistakes_name_the_allowed_tasks():
    assert parse_suites(["ruler:niah_single_1", "vt", "ppl"]) == ["ruler:niah_single_1,vt", "perplexity"]
    assert ruler_tasks(parse_suites(["ruler"])) == list(RULER_TASKS)
    with pytest.raises(PosEncError, match="unknown RULER task 'nosuch'; choose from niah_single_1, .*, fwe"):
        parse_suites(["ruler:nosuch"])
    with pytest.raises(PosEncError, match="'qa_squad' is not offline: it needs SQuAD"):
        parse_suites(["ruler:qa_squad"])


@pytest.mark.parametrize("args,message", [
    (["--suite", "ruler:nosuch"], "unknown RULER task 'nosuch'; choose from niah_single_1, niah_single_2"),
    (["--suite", "ruler", "--ruler.samples", "501"], "RULER makes 500 prompts per task and length"),
    (["--suite", "ruler", "--ruler.samples", "0"], "--ruler.samples must be an integer >= 1, got 0"),
    (["--suite", "ruler:vt", "--accelerate-config", "cpu_2proc"], "runs in one process"),
])
def test_bad_ruler_options_exit_2_before_any_load(tmp_path, capsys, args, message):
    # the model does not exist: reaching any load would fail differently
    code = cli.main(["eval", "--model", str(tmp_path / "absent"), *args, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- lm-eval's scorer, our aggregation


def test_cells_average_lm_evals_own_per_sample_scores():
    from lm_eval.tasks.ruler.common_utils import process_results

    docs = [{"input": "x", "outputs": ["1234567", "7654321"], "max_length": 1024},
            {"input": "yy", "outputs": ["42"], "max_length": 1024},
            {"input": "zzz", "outputs": ["ab", "cd", "ef"], "max_length": 1024}]
    answers = ["it is 1234567 and 7654321", "no idea", "ab, then cd"]  # 1, 0, 2/3
    logged = [{"doc": d, **process_results(d, [a])} for d, a in zip(docs, answers)]
    cell = ruler_mod._cell("niah_multivalue", 1024, logged, char_tokenizer())
    assert cell["score"] == pytest.approx((1 + 0 + 2 / 3) / 3) and cell["n"] == 3
    assert (cell["low"], cell["high"]) == pytest.approx(wilson(1 + 2 / 3, 3))
    assert cell["tokens"] == 2 and "haystack" not in cell


# ---------------------------------------------------------------- the suite on a tiny model


LENGTH = 1024
TASKS = ["niah_single_1", "niah_single_2"]  # repeated-sentence and prose (KJV) haystacks


@pytest.fixture(scope="module")
def tiny_ruler(tmp_path_factory):
    model, tokenizer = tiny_model("llama"), char_tokenizer()
    out = tmp_path_factory.mktemp("ruler")
    settings = SuiteSettings([f"ruler:{','.join(TASKS)}"], [LENGTH], ruler={"samples": 3, "gen_tokens": 8}, baseline=False)
    record = run_suites(model, tokenizer, settings, out)
    return record, tokenizer, out


def test_suite_writes_each_task_and_length_with_n_and_interval(tiny_ruler):
    record, _, out = tiny_ruler
    (run,) = record.runs
    for task in TASKS:
        cell = run.metrics[f"ruler {task}"][str(LENGTH)]
        assert cell["n"] == 3 and cell["low"] <= cell["score"] <= cell["high"]
    assert run.metrics["ruler niah_single_2"][str(LENGTH)]["haystack"] == "kjv" == record.suites["ruler"].settings["haystack"]
    assert results.load(out / "results.json").runs[0].metrics == run.metrics
    assert (out / "ruler.png").stat().st_size > 10_000
    assert f"ruler niah_single_1 score @ {LENGTH} tokens | 0.00 [0.00, 0.56] (n=3)" in results.markdown(record.runs, record.tables())


def test_prompts_fill_the_requested_length_within_the_tasks_step(tiny_ruler):
    _, tokenizer, _ = tiny_ruler
    folder_key = next(key for key in ruler_mod._TASKS if key[0] == "niah_single_1" and key[2] == LENGTH)
    for task in TASKS:
        built = ruler_mod._TASKS[(task, *folder_key[1:])]
        docs = list(built.eval_docs)[:3]
        for doc in docs:
            used = len(tokenizer(doc["input"])["input_ids"]) + 128  # RULER reserves 128 answer tokens
            assert used <= LENGTH
            # one haystack step short at most: 5 repeated sentences (~90 chars each) or 500 KJV words
            step = 5 * 90 if task == "niah_single_1" else len(" ".join(ruler_mod._kjv_words()[:500]))
            assert used > LENGTH - step - 100, (task, used)
        # the essay haystack is the KJV from its start (at 1024 characters: one step of 500 words is too many)
        if task == "niah_single_2":
            assert ruler_mod._kjv_words()[0] == "Genesis" and "Genesis" in docs[0]["input"]


def test_scores_equal_lm_evals_scorer_on_the_same_answers(tiny_ruler):
    from lm_eval.tasks.ruler.common_utils import process_results

    record, _, _ = tiny_ruler
    for task in TASKS:
        built = next(t for key, t in ruler_mod._TASKS.items() if key[0] == task)
        scores = [process_results(inst.doc, [inst.resps[0]])[str(LENGTH)] for inst in built.instances]
        assert len(scores) == 3
        assert record.runs[0].metrics[f"ruler {task}"][str(LENGTH)]["score"] == pytest.approx(sum(scores) / 3)


GUARD = """
import socket, sys
attempts = []
def refuse(self, address, *a, **k):
    attempts.append(address)
    raise OSError(f"network refused by the test: {address}")
socket.socket.connect = refuse
socket.socket.connect_ex = refuse
from hf_posenc import cli
code = cli.main(sys.argv[1:])
print("CONNECT ATTEMPTS:", attempts, file=sys.stderr)
sys.exit(code if not attempts else 3)
"""


def test_nothing_is_downloaded_in_a_fresh_process(tmp_path):
    folder = save_tiny(tmp_path / "tiny")
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", NLTK_DATA=str(tmp_path / "no-nltk-data"),
               PYTHONPATH=os.pathsep.join([str(Path(__file__).parents[1]), env.get("PYTHONPATH", "")]))
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-c", GUARD, "eval", "--model", str(folder), "--suite",
                           "ruler:niah_single_2", "--lengths", "512", "--ruler.samples", "2", "--ruler.gen-tokens", "4",
                           "--no-baseline", "--out", str(out)], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "CONNECT ATTEMPTS: []" in proc.stderr
    assert "punkt" not in proc.stderr.lower()
    for advice in ("--metadata", "already-initialized", "not of type `str`", "No aggregation function"):
        assert advice not in proc.stderr  # lm-eval's advice to its own CLI users
    cell = json.loads((out / "results.json").read_text())["runs"][0]["metrics"]["ruler niah_single_2"]["512"]
    assert cell["n"] == 2 and cell["haystack"] == "kjv"


def test_cards_carry_rates_with_n_and_interval(tmp_path):
    from hf_posenc import hub

    posenc = {"format": 1, "scheme": "yarn", "options": {"factor": 2.0}, "from": "rope"}
    run = results.Run("smollm2 yarn(factor=2.0)", "yarn", {"factor": 2.0}, posenc)
    run.put("ruler niah_single_2", 1024, {"score": 0.7, "tokens": 880, "haystack": "kjv", **rate_fields(7, 10)})
    run.put("passkey", 1024, {"accuracy": 0.5, "trials": 20, "by_depth": {}, **rate_fields(10, 20)})
    folder = tmp_path / "eval-yarn"
    folder.mkdir()
    results.Results("eval", "smollm2", runs=[run], settings={"suite": ["passkey", "ruler:niah_single_2"]},
                    format=3).save(
        folder / "results.json", complete=True)
    card = hub.model_card(folder)
    assert "| ruler niah_single_2 score | 1024 tokens | 0.70 [0.40, 0.89] (n=10) |" in card.text
    assert "| passkey accuracy | 1024 tokens | 0.50 [0.30, 0.70] (n=20) |" in card.text
    entry = next(e for e in card.data.eval_results if e.task_name == "RULER niah_single_2")
    assert entry.metric_value == 0.7 and entry.metric_args == {"n": 10, "ci95_low": 0.3968, "ci95_high": 0.8922,
                                                               "context_length": 1024}
    assert "RULER" in entry.dataset_name and "KJV" in entry.dataset_name
