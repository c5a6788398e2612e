"""benchmarks/lengthgen/paper_tasks.py: the paper's task splits (issue 57). Each answer is recomputed here from the
prompt's words by an independent reading of the task (not by the generator's code), at train and test lengths; the
held-out prompts never appear in training; the draws are seeded; the study's smoke run at the paper's conditions
writes a run per (arm, split)."""

from __future__ import annotations

import json
import random

import pytest
from conftest import benchmark_scripts

from hf_posenc.errors import PosEncError


@pytest.fixture
def paper():
    with benchmark_scripts("lengthgen"):
        import paper_tasks

        yield paper_tasks


def _words(text: str) -> list[str]:
    return text.split()


def _number(words: list[str]) -> int:
    sign = -1 if words[0] == "-" else 1
    return sign * int("".join(words[1:] if sign < 0 else words))


def _solve(name: str, prompt: list[str]) -> list[str]:
    """The answer read off the prompt, written from the task's statement in the paper's repository."""
    body = prompt[:-1]  # the words before ">"
    if name in ("rsc", "cmc"):
        return body[1:]
    if name == "rsc2x":
        return body[1:] * 2
    if name == "rdc":  # Replace a with b in a a a
        return [body[3]] * (len(body) - 5)
    xs = body[1:]
    if name in ("mc", "mc2x", "mcrv"):
        return {"mc": xs[::-1], "mc2x": [*xs[::-1], "[NEXT]", *xs[::-1]], "mcrv": [*xs[::-1], "[NEXT]", *xs]}[name]
    if name == "cmc2x":
        return [*xs, "[NEXT]", *xs]
    if name == "addition":  # Compute a + b ?
        plus = body.index("+")
        return list(str(int("".join(body[1:plus])) + int("".join(body[plus + 1:-1]))))
    if name == "sum":
        return [str(sum(int(w) for w in body[1::2]) % 10)]
    if name == "parity":
        return ["Yes" if body[3:-2].count("1") % 2 == 0 else "No"]
    if name == "sort_single":
        return sorted(body[2:-1], key=lambda w: int(w[1:]))
    if name == "sort_multi":
        items = " ".join(body[2:-1]).split(" , ")
        return " , ".join(sorted(items, key=lambda item: int(item.replace(" ", "")))).split()
    if name == "poly":  # Evaluate x = X in c * x ** d + ...
        at = body.index("in")
        x = _number(body[3:at])
        total = 0
        for term in " ".join(body[at + 1:]).split(" + "):
            c, d = term.split(" * x ** ")
            total += _number(c.split()) * x ** int(d)
        return [str(total % 10)]
    if name == "lego":  # If a = +1 , b = - a , ... ? q
        values: dict[str, int] = {}
        clauses = " ".join(body[1:-2]).split(" , ")
        for clause in clauses:
            var, _, *rhs = clause.split()
            values[var] = 1 if rhs == ["+1"] else values[rhs[1]] * (1 if rhs[0] == "+" else -1)
        return ["+1" if values[body[-1]] > 0 else "-1"]
    raise AssertionError(f"no solver for {name}")


def test_every_answer_is_the_task_s_answer_at_train_and_test_lengths(paper):
    rng = random.Random(7)
    for name, task in paper.PAPER_TASKS.items():
        for n in (task.train_lengths[0], task.train_lengths[-1], task.test_lengths[-1]):
            for _ in range(20):
                e = paper.example(task, rng, n)
                prompt, answer = _words(e.prompt), _words(e.target)
                assert prompt[-1] == ">" and answer[-1] == "."
                assert answer[:-1] == _solve(name, prompt), (name, e)
                assert set(prompt + answer) <= set(paper.WORDS), (name, set(prompt + answer) - set(paper.WORDS))


def test_lengths_and_symbols_are_the_paper_s(paper):
    t = paper.PAPER_TASKS
    assert t["cmc"].train_lengths == tuple(range(2, 21)) and t["cmc"].test_lengths == tuple(range(21, 41))
    assert all(t[n].test_lengths == tuple(range(9, 17)) and max(t[n].train_lengths) == 8
               for n in ("addition", "sum", "parity", "sort_single", "sort_multi", "poly", "lego"))
    rng = random.Random(0)
    drawn = {w for _ in range(3000) for w in _words(paper.example(t["cmc"], rng, 20).prompt)[1:-1]}
    assert len(drawn) == 100  # the copy variants' 100 symbols
    drawn = {w for _ in range(2000) for w in _words(paper.example(t["sort_single"], rng, 8).prompt)[2:-2]}
    assert len(drawn) == 50
    assert len(_words(paper.example(t["addition"], rng, 12).prompt)) >= 1 + 12 + 1 + 1 + 1  # the longer operand
    first = {_words(paper.example(task, rng, task.train_lengths[0]).prompt)[0] for task in t.values()}
    assert first <= {"Copy:", "Replace", "Reverse:", "Compute", "Compute:", "Is", "Sort", "Evaluate", "If"}


def test_held_out_prompts_never_appear_in_training_even_with_few_instances(paper):
    # repeat one symbol has 100 distinct instances per length: training draws 1,000 per length
    s = paper.split("rsc", train=19_000, iid=10, test=5, seed=0)
    train, iid = {e.prompt for e in s["train"]}, {e.prompt for e in s["iid"]}
    assert len(s["train"]) == 19_000 and len(s["iid"]) == 190 and len(s["ood"]) == 100
    assert not train & iid and len(iid) == 190  # distinct held-out instances
    assert {e.length for e in s["ood"]} == set(range(21, 41))
    assert paper.split("sum", train=50, iid=2, test=2, seed=1) == paper.split("sum", train=50, iid=2, test=2, seed=1)
    assert paper.split("sum", train=50, iid=2, test=2, seed=1) != paper.split("sum", train=50, iid=2, test=2, seed=2)
    with pytest.raises(PosEncError, match="the paper's splits here are rsc"):
        paper.split("scan", train=1, iid=1, test=1, seed=0)


def test_a_length_with_fewer_prompts_than_the_held_out_count_keeps_half_for_training(paper):
    """Parity of 3 bits has 8 prompts: holding out all of them (10 asked) left training nothing to draw at that
    length, and the pilot's parity run looped for 20 CPU-minutes before its first step."""
    s = paper.split("parity", train=600, iid=10, test=1, seed=0)
    iid = {e.prompt for e in s["iid"]}
    held3 = [e for e in s["iid"] if e.length == 3]
    assert len(held3) == 4 and len({e.prompt for e in held3}) == 4  # half of the 8, each once
    assert {e.length for e in s["train"]} == set(range(3, 9)) and not {e.prompt for e in s["train"]} & iid
    assert len({e.prompt for e in s["train"] if e.length == 3}) == 4  # the other half


def test_the_paper_smoke_study_runs_and_refuses_a_learned_table(tmp_path):
    with benchmark_scripts("lengthgen"):
        import run as study

        with pytest.raises(PosEncError, match="a learned table is not an arm of the paper's study"):
            study.main(["--paper", "--smoke", "--arms", "learned", "--out", str(tmp_path / "refused")])
        assert not (tmp_path / "refused").exists()
        out = tmp_path / "paper"
        assert study.main(["--paper", "--smoke", "--arms", "rope_partial", "--out", str(out)]) == 0
    saved = json.loads((out / "results.json").read_text())
    assert sorted(r["task"] for r in saved["runs"]) == ["cmc", "sum"]
    run = saved["runs"][0]
    assert set(run["iid_by_length"]) == {"2", "3", "4"} and set(run["ood_by_length"]) == {"5", "6"}
    assert saved["settings"]["paper"] is True and run["lr"] == saved["settings"]["lr"]


def test_their_rotary_is_8_pairs_at_their_frequencies():
    """Their code rotates 16 of 64 head dimensions at base 10000 (theta_i = 10000^(-2i/16), i = 0..7: 1 down to
    ~3.2e-4 rad/token); the study's `rope_partial` at the paper's width and heads must be exactly those pairs (the
    2 x 64 study's 25% of a 16-dim head was 2 pairs, at 1 and 0.01)."""
    import torch

    with benchmark_scripts("lengthgen"):
        from arms import arms
        from settings import PAPER
        from train import init_model

        model = init_model(arms(PAPER.width)["rope_partial"], PAPER, 0)
    assert PAPER.width // PAPER.heads == 64
    inv_freq = next(b for n, b in model.named_buffers() if n.endswith("inv_freq"))
    theirs = torch.tensor([10000 ** (-2 * i / 16) for i in range(8)])
    torch.testing.assert_close(inv_freq.float(), theirs, rtol=1e-5, atol=0)
