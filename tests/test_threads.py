"""`demo` and `eval` hold torch's threads to the idle cores for the command only (issue 38: one demo on a loaded
2-core machine took 3,332 CPU-s instead of 815 while torch's threads waited on busy cores)."""

from __future__ import annotations

import os

import torch

from hf_posenc.cli import threads


def test_free_cores_are_between_one_and_the_cores_this_process_may_use():
    free, usable = threads.free_cores()
    assert usable == len(os.sched_getaffinity(0)) and 1 <= free <= usable


def test_threads_are_never_raised_and_come_back_after_the_command(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    with threads.limited_threads("importing"):
        inside = torch.get_num_threads()
    assert 1 <= inside <= before and torch.get_num_threads() == before


def test_omp_num_threads_wins(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    before = torch.get_num_threads()
    with threads.limited_threads("importing"):
        assert torch.get_num_threads() == before
