"""results.json: one typed, versioned format that eval, train and demo write and everything reads back;
older files are refused with a message naming their format."""

from __future__ import annotations

import json

import pytest
from conftest import tiny_model
from test_evaluation import char_tokenizer
from test_train import REPO

import hf_posenc as hp
from hf_posenc import cli, data, evaluation, hub, results
from hf_posenc.cli import demo
from hf_posenc.errors import PosEncError
from hf_posenc.evaluation import held_out, older


def _record() -> results.Results:
    run = results.Run("tiny yarn(factor=2)", "yarn", {"factor": 2}, {"format": 1, "scheme": "yarn"})
    run.put("perplexity", 64, {"perplexity": 9.5, "loss": 2.25, "tokens": 63, "windows": 1, "stride": 64})
    run.put("perplexity", 128, {"skipped": "IndexError: index out of range"})
    run.put("copy", 2, {"exact_match": 0.5})
    record = results.Results("eval", "tiny", settings={"suite": ["perplexity", "copy"], "lengths": [64, 128]},
                             runs=[run])
    record.suites = older.described(record)  # the sections the suites write (run_suites)
    return record


def test_results_round_trip_through_save_and_load(tmp_path):
    record = _record()
    path = record.save(tmp_path / "results.json", complete=True)
    loaded = results.load(path)
    assert loaded == record and loaded.complete and loaded.format == results.FORMAT
    assert loaded.run("tiny yarn(factor=2)").cells("perplexity")[0] == ("64", record.runs[0].metrics["perplexity"]["64"])
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]  # written through a temp file, renamed
    with pytest.raises(PosEncError, match="no run 'after training' in these results; runs: tiny yarn"):
        loaded.run("after training")
    with pytest.raises(PosEncError, match="kind must be one of eval, train, demo"):
        results.Results("benchmark", "tiny")


@pytest.mark.parametrize("content, message", [
    ({"format": 1, "label": "x", "model": "m", "results": {"ppl": {}}}, r"results format 1 \(hf-posenc 0.1 `eval`\)"),
    ({"scheme": "alibi", "before": {"loss": 1.0}, "after": {"loss": 0.5}}, "without a format field .*`train` or `demo`"),
    ({"model": "smollm2", "runs": [{"label": "x", "results": {"ppl": {}}}]}, "without a format field"),
    ({"format": 5, "kind": "eval"}, "results format 5, from a newer hf-posenc"),
    ({"format": 2, "kind": "eval", "model": "m", "runs": [], "surprise": 1}, "not a valid format-2 results file"),
    ([1, 2], "not a results file: it holds a JSON list"),
])
def test_other_formats_are_refused_naming_them(tmp_path, content, message):
    path = tmp_path / "results.json"
    path.write_text(json.dumps(content))
    with pytest.raises(PosEncError, match=message):
        results.load(path)


def test_format_2_files_still_load_and_print_without_intervals(tmp_path):
    run = {"label": "m", "metrics": {"passkey": {"1024": {"accuracy": 0.5, "trials": 2}}}}
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"format": 2, "kind": "eval", "model": "m", "runs": [run]}))
    loaded = evaluation.load_results(path)
    assert loaded.format == 2 and "| m | passkey accuracy @ 1024 tokens | 0.5 |" in results.markdown(
        loaded.runs, loaded.tables())


def test_a_card_refuses_an_old_results_file_instead_of_guessing(tmp_path):
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "results.json").write_text(json.dumps({"format": 1, "results": {}}))
    with pytest.raises(PosEncError, match="eval/results.json holds results format 1"):
        hub.model_card(tmp_path)
    assert cli.main(["eval", "--compare", str(tmp_path / "eval" / "results.json"), "--out", str(tmp_path / "c")]) == 2


def test_demo_runs_the_whole_flow_and_its_numbers_match_a_direct_computation(tmp_path, capsys):
    folder = tmp_path / "tiny"
    tiny_model("llama").save_pretrained(folder)
    char_tokenizer().save_pretrained(folder)
    out = tmp_path / "demo"
    assert cli.main(["demo", "--model", str(folder), "--lengths", "16,48", "--target-tokens", "8", "--windows", "2",
                     "--steps", "2", "--recipe", demo.RECIPE, "--out", str(out)]) == 0
    record = results.load(out / "results.json")
    assert record.kind == "demo" and record.complete
    measured = record.suites["perplexity"].settings
    assert measured["perplexity_mode"] == "same_target" and measured["target_tokens"] == 8
    labels = ["original (rope)", "yarn x2", "alibi, no training", "alibi, 2 recovery steps"]
    assert [run.label for run in record.runs] == labels
    model = hp.patch(tiny_model("llama"), "yarn", factor=2.0)
    ids = evaluation.text_token_ids(char_tokenizer(), data.long_text("kjv"), 48 * (1 + 8 * 2))
    expected = evaluation.perplexity_by_length(model, ids, [16, 48], max_windows=2, target=8)
    yarn = record.run("yarn x2")
    assert yarn.scheme == "yarn" and yarn.options == {"factor": 2.0}
    for length in (16, 48):
        assert yarn.metrics["perplexity"][str(length)]["loss"] == pytest.approx(expected[length]["loss"], abs=1e-5)
    # every model, every length: the same target tokens
    assert len({cell["targets"] for run in record.runs for cell in run.metrics["perplexity"].values()}) == 1
    table = (out / "results.md").read_text().splitlines()
    assert table[0] == "| model | ppl @ 16 | ppl @ 48 | passkey @ 16 | passkey @ 48 |" and len(table) == 2 + 4 + 2
    assert table[-1].startswith("Scored places: perplexity scored the same last 8 tokens of 2 windows of kjv")
    assert table[3].startswith(f"| yarn x2 | {expected[16]['perplexity']:.2f} | {expected[48]['perplexity']:.2f} |")
    # passkey: 2 keys x 5 depths per length (48 one-character tokens are too few for its prompt: skipped)
    passkey = record.suites["passkey"].settings
    assert passkey["trials"] * len(passkey["depths"]) == 10
    assert "skipped" in yarn.metrics["passkey"]["48"] and table[3].endswith("| skipped | skipped |")
    assert (out / "perplexity.png").stat().st_size > 1000 and (out / "inspect" / "rotary.png").stat().st_size > 1000
    # the recovered model reloads patched, its card carries its eval results as model-index, the repo is staged
    recovered = out / "smollm2-alibi-recovered"
    assert hp.describe(hp.from_pretrained(recovered)).scheme == "alibi"
    assert results.load(recovered / "eval" / "results.json").runs[0].metrics == record.runs[-1].metrics
    card = (out / "hub-staged" / "README.md").read_text()
    assert "model-index:" in card and "name: perplexity @ 48 tokens" in card
    # its results table: the recovered model as labelled in the demo, the original beside it (the baseline)
    assert "| metric | setting | alibi, 2 recovery steps | original (rope) |" in card and "alibi()" not in card
    assert (out / "hub-staged" / "config.json").is_file()
    printed = capsys.readouterr().out
    assert str(out / "hub-staged") in printed and str(out / "inspect" / "rotary.png") in printed


def test_compare_reads_eval_train_and_demo_results_alike(tmp_path):
    eval_path = _record().save(tmp_path / "eval.json", complete=True)
    train = results.Results("train", "tiny", runs=[results.Run("after training", "alibi")])
    train.runs[0].put("perplexity", 32, {"perplexity": 3.5, "loss": 1.25, "tokens": 31, "windows": 1, "stride": 32})
    train.settings = {"task": "causal_lm", "dataset_name": "kjv"}
    train.suites = {held_out.NAME: held_out.section(train)}  # as the runner describes its tables
    train_path = train.save(tmp_path / "train.json")
    # sliding windows of a text vs held-out training blocks: not the same measurement, so not by default
    with pytest.raises(PosEncError, match=r"measured differently \(perplexity measured by differ\).*--mixed"):
        evaluation.compare([eval_path, train_path], tmp_path / "refused")
    assert not (tmp_path / "refused").exists()
    table = evaluation.compare([eval_path, train_path], tmp_path / "cmp", mixed=True)
    assert "| tiny yarn(factor=2) [1] | perplexity @ 64 tokens | 9.5 |" in table
    assert "| tiny yarn(factor=2) [1] | perplexity @ 128 tokens | skipped (IndexError" in table
    assert "| after training [2] | perplexity @ 32 tokens | 3.5 |" in table
    assert "| tiny yarn(factor=2) [1] | copy exact match @ 2 digits | 0.5 |" in table
    assert "perplexity measured by=held_out" in table
    saved = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert [r["kind"] for r in saved["results"]] == ["eval", "train"]
    assert (tmp_path / "cmp" / "perplexity.png").is_file() and (tmp_path / "cmp" / "length_generalization.png").is_file()


def test_the_demo_prints_its_recovery_beside_the_spread_measured_over_seeds():
    """The spread the demo prints is the committed measurement's (benchmarks/demo_recovery.py --seeds), and only for
    the settings it was measured at."""
    import argparse
    import statistics

    rows = [json.loads(line) for line in (REPO / "benchmarks" / "results" / "recovery" / "demo_variants.jsonl")
            .read_text().splitlines()]
    seeded = [row["demo2"] for row in rows if row["name"].startswith("demo recovery (128 x 2), seed ")]
    assert len(seeded) == demo.SPREAD_SEEDS
    for n, (mean, low, high) in demo.SPREAD.items():
        values = [row[str(n)] for row in seeded]
        assert (mean, low, high) == tuple(round(v, 2) for v in (statistics.mean(values), min(values), max(values)))
    args = argparse.Namespace(model="smollm2", steps=128, recipe=demo.RECIPE, windows=2, target_tokens=64,
                              lengths=[128, 512, 1024])
    assert "over 3 other seeds (mean [min..max]): ppl @ 128 44.70 [33.34..51.19]" in demo._spread(args)
    assert demo._spread(argparse.Namespace(**{**vars(args), "steps": 64})) is None
    assert demo._spread(argparse.Namespace(**{**vars(args), "lengths": [256]})) is None
