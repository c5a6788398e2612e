"""The matrix keeps every registered scheme and adapter in every row, so a new one cannot skip a row; the
seq2seq matrix (tests/test_seq2seq.py) the same for every scheme and encoder-decoder family."""

from __future__ import annotations

import inspect

import pytest

import hf_posenc as hp
import test_invariants  # noqa: F401  (importing a test module registers its rows)
import test_bf16  # noqa: F401
import test_paths  # noqa: F401
import test_seq2seq
from conftest import TINY_CONFIGS
from hf_posenc.adapters.base import ADAPTERS
from matrix import CELLS, ROWS, SCHEMES, adapter_of, scheme_of


def test_the_settings_name_every_registered_scheme_and_adapter():
    assert {scheme_of(label) for label in SCHEMES} == set(hp.list_schemes())
    assert {adapter_of(arch) for arch in TINY_CONFIGS} == {adapter.name for adapter in ADAPTERS.values()}


def test_the_rows_are_registered():
    assert len(ROWS) >= 17 and "test_deepcopy_is_independent_and_torch_save_round_trips" in ROWS


@pytest.mark.parametrize("name", sorted(ROWS))
def test_every_row_holds_every_scheme_and_adapter_of_its_scope(name):
    in_scope, cells = ROWS[name]
    assert in_scope and set(in_scope) <= set(CELLS) and set(cells) <= set(in_scope)
    assert {scheme_of(label) for _, label in cells} == {scheme_of(label) for _, label in in_scope}
    assert {adapter_of(arch) for arch, _ in cells} == {adapter_of(arch) for arch, _ in in_scope}


def test_every_seq2seq_test_over_families_is_a_registered_row():
    """A test parametrized over (family, label) without `row(...)` would escape the check below."""
    tests = {name for name, test in vars(test_seq2seq).items()
             if name.startswith("test_") and "family" in inspect.signature(test).parameters}
    assert tests == set(test_seq2seq.ROWS) and len(tests) >= 10


def test_the_seq2seq_cells_hold_every_scheme_and_family():
    """Every registered scheme fits some family's text stacks (xPos and Self-Extend: Whisper's decoder alone),
    the full rows run every cell, and the own-scheme row every family."""
    rows, families = test_seq2seq.ROWS, set(test_seq2seq.FAMILIES)
    assert {scheme_of(label) for _, label in test_seq2seq.CELLS} == set(hp.list_schemes())
    assert rows["test_patch_moves_logits_and_unpatch_is_bit_exact"][1] == test_seq2seq.CELLS
    assert {f for f, _ in rows["test_own_scheme_equals_the_stock_model"][1]} == families
    assert {f for f, _ in test_seq2seq.TRAINABLE_CELLS} == families


@pytest.mark.parametrize("name", sorted(test_seq2seq.ROWS))
def test_every_seq2seq_row_holds_every_scheme_and_family_of_its_scope(name):
    in_scope, cells = test_seq2seq.ROWS[name]
    assert in_scope and set(in_scope) <= set(test_seq2seq.CELLS) and set(cells) <= set(in_scope)
    assert {scheme_of(label) for _, label in cells} == {scheme_of(label) for _, label in in_scope}
    assert {family for family, _ in cells} == {family for family, _ in in_scope}
