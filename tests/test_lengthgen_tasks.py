"""The length-generalisation tasks of Kazemnejad et al. (2023) in the package: generators, tokenizer, scorer, MRR
ranking, and the `lengthgen` eval suite on a tiny causal LM."""

from __future__ import annotations

import math

import pytest
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from hf_posenc import cli, results
from hf_posenc.errors import PosEncError
from hf_posenc.evaluation.lengthgen import ranking, scoring, tasks, vocab
from hf_posenc.stats import wilson

TRAIN, TEST = list(range(1, 21)), list(range(21, 41))


@pytest.mark.parametrize("name", list(tasks.TASKS))
def test_every_task_makes_its_lengths_and_answers(name):
    made = tasks.draw(name, [1, 7, 30], 5, seed=3)
    assert [e.length for e in made] == [1] * 5 + [7] * 5 + [30] * 5
    for e in made:
        words, answer = e.prompt.split(), e.target.split()
        assert words[-1] == tasks.SEPARATOR and answer[-1] == tasks.END and e.target.startswith(" ")
        symbols, answer = words[:-1], answer[:-1]
        assert len(symbols) == e.length and set(symbols) <= set(tasks.SYMBOLS)
        expected = {"repeat": symbols, "copy": symbols, "reverse": symbols[::-1], "sort": sorted(symbols)}[name]
        assert answer == expected
        if name == "repeat":
            assert len(set(symbols)) == 1


def test_draws_are_seeded():
    assert tasks.draw("copy", [5, 9], 4, seed=1) == tasks.draw("copy", [5, 9], 4, seed=1)
    assert tasks.draw("copy", [5, 9], 4, seed=1) != tasks.draw("copy", [5, 9], 4, seed=2)


def test_splits_do_not_overlap_where_the_length_has_room():
    splits = tasks.split("copy", TRAIN, TEST, train=2000, iid=20, test=10, seed=0)
    assert len(splits["train"]) == 2000 and len(splits["iid"]) == 20 * 20 and len(splits["ood"]) == 10 * 20
    train = {e.prompt for e in splits["train"]}
    roomy = [e for e in splits["iid"] if 10 ** e.length >= 2 * 20 + sum(p.count(" ") == e.length for p in train)]
    assert len(roomy) >= 16 * 20 and not {e.prompt for e in roomy} & train
    assert {e.length for e in splits["ood"]} == set(TEST)
    # length 1 has ten instances: the in-distribution split repeats training ones there (no room), as it must
    assert sum(e.length == 1 for e in splits["iid"]) == 20
    # repeat one symbol has ten instances per length: the split draws them all the same
    assert len(tasks.split("repeat", [3], [5], train=30, iid=12, test=12, seed=0)["iid"]) == 12


@pytest.mark.parametrize("train, test, match", [
    ([1, 20], [10, 30], "longer than the train lengths"), ([], [5], "train lengths must be"),
    ([0, 3], [5], "train lengths must be"), ([3], [4.5], "test lengths must be")])
def test_bad_lengths_are_refused(train, test, match):
    with pytest.raises(PosEncError, match=match):
        tasks.split("copy", train, test, train=10, iid=1, test=1, seed=0)


def test_unknown_task_is_refused_naming_the_tasks():
    with pytest.raises(PosEncError, match="unknown length-generalisation task 'add'.*repeat, copy, reverse, sort"):
        tasks.draw("add", [3], 1, 0)


def test_the_tokenizer_spells_the_tasks_and_saves(tmp_path):
    tok = vocab.build_tokenizer()
    vocab.check_tokenizer(tok)
    e = tasks.draw("reverse", [6], 1, 0)[0]
    prompt, full = tok(e.prompt)["input_ids"], tok(e.prompt + e.target)["input_ids"]
    assert full[: len(prompt)] == prompt and len(full) == 2 * 6 + 2 and tok.unk_token_id not in full
    assert tok.decode(full[len(prompt):]) == e.target.strip()
    tok.save_pretrained(tmp_path)
    again = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert again(e.prompt + e.target)["input_ids"] == full and again.pad_token == vocab.PAD


def test_a_tokenizer_that_cannot_spell_the_symbols_is_refused():
    core = Tokenizer(models.WordLevel({"<unk>": 0, "a": 1, "b": 2, ">": 3}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    letters = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>")
    with pytest.raises(PosEncError, match=r"cannot spell the task words 0 1 2 3 4 5 6 7 8 9 \."):
        vocab.check_tokenizer(letters)


def test_exact_match_by_length_on_hand_made_outputs():
    references = [" 1 2 .", " 3 4 .", " 5 6 .", " 1 2 3 .", " 4 5 6 ."]
    predictions = ["1 2 .", "3 4", "5 6 .", "1 2 3 .", "4 5 6 7 ."]  # a missing end and an extra symbol both fail
    cells = scoring.by_length(predictions, references, [2, 2, 2, 3, 3])
    assert cells[2]["exact_match"] == pytest.approx(2 / 3) and cells[2]["n"] == 3
    assert (cells[2]["low"], cells[2]["high"]) == pytest.approx(wilson(2, 3))
    assert cells[3]["exact_match"] == 0.5 and cells[3]["n"] == 2
    both = scoring.pooled(cells)
    assert both["exact_match"] == pytest.approx(3 / 5) and both["n"] == 5 and both["low"] < 0.6 < both["high"]


def test_mrr_on_a_hand_made_table():
    table = {"a": {"x": 0.9, "y": 0.5, "z": 0.1}, "b": {"x": 0.2, "y": 0.8, "z": 0.2}, "c": {"x": 0.9, "y": 1.0, "z": 0.0}}
    # ranks: a x1 y2 z3; b y1, x and z tie at 2; c y1 x2 z3
    got = ranking.mrr(table)
    assert got == pytest.approx({"x": (1 + 1 / 2 + 1 / 2) / 3, "y": (1 / 2 + 1 + 1) / 3, "z": (1 / 3 + 1 / 2 + 1 / 3) / 3})
    assert list(got) == ["y", "x", "z"]
    with pytest.raises(PosEncError, match="split 'b' scores"):
        ranking.mrr({"a": {"x": 1.0, "y": 0.0}, "b": {"x": 1.0}})


def test_the_papers_numbers_are_data_with_their_source():
    mrr = ranking.PAPER["mrr_ood"]
    assert list(mrr) == ["NoPE", "T5", "ALiBi", "Rotary", "APE"] and set(ranking.PAPER_ARMS) == set(mrr)
    # the per-seed values average to what the issue quotes from the paper (repeat: 0.99 0.77 0.29 0.00 0.00) and
    # the stored MRR rounds to its ranking (0.69 0.55 0.50 0.33 0.22)
    assert {k: round(v, 2) for k, v in ranking.paper_ood("repeat").items()} == {
        "NoPE": 0.99, "T5": 0.77, "ALiBi": 0.29, "Rotary": 0.0, "APE": 0.0}
    assert [round(v, 2) for v in mrr.values()] == [0.69, 0.55, 0.5, 0.33, 0.22]
    for task in ("repeat", "copy", "reverse"):
        seeds = ranking.PAPER["by_task"][task]["ood_by_seed"]
        assert set(seeds) == set(mrr) and all(len(v) == len(ranking.PAPER_SEEDS) for v in seeds.values())
        assert all(0 <= x <= 1 and math.isfinite(x) for v in seeds.values() for x in v)
    assert ranking.paper_ood("sort") == {}  # published as a figure: only its ranks are data
    assert sorted(ranking.PAPER["sort_rank"]["rank"].values()) == [1, 2, 3, 4, 5]
    assert "2305.19466" in ranking.PAPER["source"] and "d06170ec" in ranking.PAPER["source"]


def _tiny_decoder(folder, n_positions=96):
    tok = vocab.build_tokenizer()
    config = transformers.GPT2Config(vocab_size=len(tok), n_positions=n_positions, n_embd=32, n_layer=1, n_head=2,
                                     pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def test_score_agrees_with_generate(tmp_path):
    import torch

    folder = _tiny_decoder(tmp_path / "m")
    model, tok = transformers.AutoModelForCausalLM.from_pretrained(folder), transformers.AutoTokenizer.from_pretrained(folder)
    examples = tasks.draw("repeat", [2, 3], 3, 0)
    # the model's greedy generation, compared by hand with the targets, gives the scorer's numbers
    made = []
    for e in examples:
        ids = tok(e.prompt, return_tensors="pt")["input_ids"]
        steps = len(tok(e.target)["input_ids"])
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=steps, do_sample=False, pad_token_id=tok.pad_token_id)
        made.append(tok.decode(out[0, ids.shape[1]:]))
    expected = scoring.by_length(made, [e.target for e in examples], [e.length for e in examples])
    assert scoring.score(model, tok, examples, batch_size=2) == expected


def test_eval_suite_scores_a_causal_lm_by_length(tmp_path):
    folder = _tiny_decoder(tmp_path / "m")
    out = tmp_path / "eval"
    assert cli.main(["eval", "--model", str(folder), "--suite", "lengthgen:reverse,sort", "--lengths", "32",
                     "--lengthgen.symbol-lengths", "2,5,40", "--lengthgen.per-length", "3", "--lengthgen.shots", "1", "--out", str(out)]) == 0
    run = results.load(out / "results.json").runs[0]
    assert set(run.metrics) == {"lengthgen sort", "lengthgen reverse"}
    cell = run.metrics["lengthgen sort"]["5"]
    assert cell["n"] == 3 and 0 <= cell["low"] <= cell["exact_match"] <= cell["high"] <= 1
    # one shot and the prompt of 40 symbols need 164 positions: past GPT-2's table of 96, recorded as skipped
    assert "learned position table" in run.metrics["lengthgen reverse"]["40"]["skipped"]


def test_eval_suite_refuses_an_unknown_task():
    from hf_posenc.evaluation.suite import parse_suites

    assert parse_suites(["lengthgen:sort", "lengthgen:repeat"]) == ["lengthgen:sort", "lengthgen:repeat"]
    with pytest.raises(PosEncError, match="unknown lengthgen task.*add.*repeat, copy, reverse, sort"):
        parse_suites(["lengthgen:add"])
