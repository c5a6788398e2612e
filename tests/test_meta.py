"""The matrix keeps every registered scheme and adapter in every row, so a new one cannot skip a row."""

from __future__ import annotations

import pytest

import hf_posenc as hp
import test_invariants  # noqa: F401  (importing a test module registers its rows)
import test_paths  # noqa: F401
from conftest import TINY_CONFIGS
from hf_posenc.registry import ADAPTERS
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
