"""The invariant matrix (DESIGN section 8): every architecture x scheme setting, and the rows that test it.

A row is a test function parametrized over (arch, label) cells by `@row(...)`: all supported cells, or a
sample of them where the full product would not fit the time budget. A sample still puts every scheme and
every adapter of the row's scope in the row; `test_meta.py` checks that, and that the settings below name
every registered scheme and the tiny configs every registered adapter, so a new scheme cannot skip a row.
"""

from __future__ import annotations

from typing import Callable, Iterable

import pytest
import torch

import hf_posenc as hp
from conftest import CAUSAL, TINY, TINY_CONFIGS, tiny_model
from hf_posenc.catalog import adapter_for, get_scheme


# The order of the labels before the settings moved into the schemes (issue 39): `sample` rotates architectures
# through the labels in order, so keeping it keeps every sampled row on the cells it ran before. Labels added
# since follow, by scheme name, whole-model settings before per-layer ones.
EARLIER_LABELS = ("learned", "sinusoidal", "nope", "rope", "rope-partial", "linear", "ntk", "dynamic", "yarn", "llama3",
                  "longrope", "alibi", "concat", "concat-learned", "untied", "t5", "fire", "kerple", "xpos",
                  "self_extend", "p_rope", "hope", "fope", "pope", "cope", "nope-l1", "rope-l0", "alibi-l1", "xpos-l0")


def settings() -> tuple[dict[str, dict], dict[str, str]]:
    """(label -> options, label -> scheme) of every registered scheme's `test_settings` (the scheme with its
    defaults where it names none), in the matrix's order (`EARLIER_LABELS`)."""
    labelled = [(label, name, options) for name in hp.list_schemes()
                for label, options in (get_scheme(name).test_settings or {name: {}}).items()]
    labelled.sort(key=lambda item: (0, EARLIER_LABELS.index(item[0]), False) if item[0] in EARLIER_LABELS
                  else (1, 0, "layers" in item[2]))  # stable: by scheme name within each group
    twice = sorted({label for label, _, _ in labelled if [item[0] for item in labelled].count(label) > 1})
    assert not twice, f"labels taken by two schemes' test_settings: {twice}"
    return {label: options for label, _, options in labelled}, {label: name for label, name, _ in labelled}


SCHEMES, SCHEME_NAME = settings()


def tables(settings: dict[str, dict], names: dict[str, str]) -> set[str]:
    """The settings whose positions come from a table of fixed length (`Scheme.fixed_table`)."""
    return {label for label, options in settings.items() if get_scheme(names[label]).fixed_table(options)}


def from_weights(settings: dict[str, dict], names: dict[str, str]) -> set[str]:
    """The settings whose patch reads the model's own weights (`Scheme.reads_weights`): none on meta."""
    return {label for label in settings if get_scheme(names[label]).reads_weights}


TABLES = tables(SCHEMES, SCHEME_NAME)
FROM_WEIGHTS = from_weights(SCHEMES, SCHEME_NAME)
# a shift of positions changes them (`Scheme.shift_invariant`: absolute positions, FoPE's series' cross terms)
ABSOLUTE = {label for label in SCHEMES if not get_scheme(SCHEME_NAME[label]).shift_invariant}


def scheme_of(label: str) -> str:
    return SCHEME_NAME.get(label, label)


def adapter_of(arch: str) -> str:
    return adapter_for(TINY_CONFIGS[arch]()).name


def keeps_table(arch: str, label: str) -> bool:
    """A per-layer label on a model whose positions enter at the input keeps the model's own table (and its
    length) for every layer."""
    return "layers" in SCHEMES[label] and adapter_for(TINY_CONFIGS[arch]()).slot is not None


def site_of(label: str) -> str:
    return get_scheme(scheme_of(label)).site


def layers_validate(model_or_config: object, label: str) -> bool:
    """A per-layer label's layers validate on the model (a whole-model label: nothing to check). A refused
    per-layer cell (a shared bias, positions only at the input) is no cell of the matrix."""
    if "layers" not in SCHEMES[label]:
        return True
    try:
        hp.validate(model_or_config, scheme_of(label), **SCHEMES[label])
    except hp.PosEncError:
        return False
    return True


def supported(arch: str, label: str) -> bool:
    """The cell can be patched: the scheme is supported, and a per-layer label's layers validate too."""
    config = TINY_CONFIGS[arch]()
    return hp.supports(config, scheme_of(label)) and layers_validate(config, label)


def cells() -> list[tuple[str, str]]:
    """Every supported (architecture, label) cell of the settings."""
    return [(arch, label) for arch in TINY_CONFIGS for label in SCHEMES if supported(arch, label)]


CELLS = cells()
ATOL = 1e-5

# row name -> (the cells in its scope, the cells it runs)
ROWS: dict[str, tuple[list[tuple[str, str]], list[tuple[str, str]]]] = {}


def sample(scope: list[tuple[str, str]], per_label: int = 1) -> list[tuple[str, str]]:
    """`per_label` cells for every label of `scope`, rotating through architectures so that every one
    of them appears too."""
    picked: list[tuple[str, str]] = []
    turn = 0
    for label in dict.fromkeys(label for _, label in scope):
        archs = [arch for arch, lab in scope if lab == label]
        for _ in range(min(per_label, len(archs))):
            picked.append((archs[turn % len(archs)], label))
            turn += 1
    missing = dict.fromkeys(arch for arch, _ in scope if arch not in {a for a, _ in picked})
    picked += [next(cell for cell in scope if cell[0] == arch) for arch in missing]
    return list(dict.fromkeys(picked))


def scope(causal: bool = False, sites: Iterable[str] | None = None) -> list[tuple[str, str]]:
    """The supported cells a row is about: causal architectures only, or some sites only."""
    sites = set(sites) if sites is not None else None
    return [(a, lab) for a, lab in CELLS if (not causal or a in CAUSAL) and (sites is None or site_of(lab) in sites)]


def focus(cells_in_scope: list[tuple[str, str]], sites: Iterable[str] = ("score", "attention"),
          per_label: int = 1) -> list[tuple[str, str]]:
    """Every cell of the sites a row is mostly about (where attention sees key positions), a sample of the rest."""
    sites = set(sites)
    return [c for c in cells_in_scope if site_of(c[1]) in sites] + sample(
        [c for c in cells_in_scope if site_of(c[1]) not in sites], per_label)


def row(cells_in_scope: list[tuple[str, str]], per_label: int | None = None,
        cells: list[tuple[str, str]] | None = None) -> Callable:
    """Parametrize a test over its cells (all of `cells_in_scope`, `per_label` of each label, or the given
    `cells`) and register it as a row of the matrix."""
    if cells is None:
        cells = cells_in_scope if per_label is None else sample(cells_in_scope, per_label)

    def register(test: Callable) -> Callable:
        ROWS[test.__name__] = (cells_in_scope, cells)
        params = [pytest.param(arch, label, id=f"{arch}-{label}") for arch, label in cells]
        return pytest.mark.parametrize("arch,label", params)(test)

    return register


def patched(arch: str, label: str, attn: str = "sdpa", seed: int = 0, **kw) -> torch.nn.Module:
    return hp.patch(tiny_model(arch, attn=attn, seed=seed, **kw), scheme_of(label), **SCHEMES[label])


def ids(batch: int = 2, length: int = 12, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, TINY["vocab"], (batch, length), generator=torch.Generator().manual_seed(seed))


def position_offset(model: torch.nn.Module) -> int:
    """Row of position 0 in the model's own table (RoBERTa counts from padding_idx + 1)."""
    slot = adapter_for(model).slot
    return slot.offset(model.config) if slot else 0
