"""docs/extending.md runs as written: each example in a fresh interpreter, since registering a scheme, an
adapter or a suite lasts for the process and would leak into the registry that tests/test_meta.py checks."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import Gemma3Config

import hf_posenc as hp
from hf_posenc.adapters.llama import LLAMA
from hf_posenc.catalog import get_scheme
from hf_posenc.registry import ADAPTERS
from integration_support import doc_blocks

DOC = Path(__file__).resolve().parents[1] / "docs" / "extending.md"
SECTIONS = ["A new score bias", "A new evaluation suite", "An adapter for a model type the generic adapter refuses"]


@pytest.mark.parametrize("section", SECTIONS)
def test_the_example_runs_and_its_checks_hold(section, tmp_path):
    (code,) = doc_blocks(section, "python", DOC)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]


def test_a_name_is_registered_once_and_a_refused_adapter_takes_none_of_its_types():
    with pytest.raises(ValueError, match="'alibi' is already registered"):
        hp.register_scheme(get_scheme("alibi"))
    clash = dataclasses.replace(LLAMA, name="clash", model_types=("not_a_model_type", "llama"))
    with pytest.raises(ValueError, match="'llama' already has adapter 'llama'"):
        hp.register_adapter(clash)
    assert "not_a_model_type" not in ADAPTERS and ADAPTERS["llama"] is LLAMA


def test_the_generic_adapter_still_refuses_gemma3_so_the_override_is_needed():
    with pytest.raises(hp.PosEncError, match="vision_tower.*register a hand-written adapter"):
        hp.catalog.adapter_for(Gemma3Config())


def test_an_adapter_written_with_flat_fields_still_works_and_names_the_record_that_replaced_each():
    """An Adapter is a composition of records (issue 49); one written, read or replaced with the flat fields it had
    before is the same adapter, with a DeprecationWarning naming the record and field of each."""
    from hf_posenc.adapters.base import Adapter, Blocks

    with pytest.warns(DeprecationWarning, match=r"blocks\.attention, blocks\.layers, rotation\.module"):
        flat = Adapter(name="llama", model_types=LLAMA.model_types, native="rope", causal=True, layers="layers",
                       attention="self_attn", rotary="rotary_emb", qk=LLAMA.qk)
    assert flat == LLAMA and flat.blocks == Blocks("layers", "self_attn") and flat.slot is None
    with pytest.warns(DeprecationWarning, match=r"Adapter\.rotary is deprecated: read Adapter\.rotation\.module"):
        assert LLAMA.rotary == "rotary_emb"
    with pytest.warns(DeprecationWarning, match=r"Adapter\.position_offset is deprecated"):
        assert LLAMA.position_offset(LLAMA) == 0  # no slot: its record's default
    with pytest.warns(DeprecationWarning):
        off = dataclasses.replace(LLAMA, rotary=None, attention_layers=(1,))
    assert off.rotation is None and off.blocks == Blocks("layers", "self_attn", attention_layers=(1,))
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['rotray'\]"):
        Adapter(name="x", model_types=("x",), native="rope", causal=True, blocks=LLAMA.blocks, rotray="r")


def test_a_config_only_patch_was_a_native_one_and_its_old_names_still_work():
    """"native" means the model's own (issue 49); a patch plain transformers rebuilds from the config alone is
    *config-only*. A scheme written with `native = False`, and code reading `PatchState.native`,
    `loading.native_config` or `Entry.native_slot` (now `keeps_slot`), keep working with a DeprecationWarning."""
    import pickle

    from hf_posenc import loading
    from hf_posenc.schemes.base import RotaryScheme
    from hf_posenc.sites.entry import Entry
    from hf_posenc.state import PatchState

    with pytest.warns(DeprecationWarning, match="OldStyle.native is deprecated: set config_only"):
        class OldStyle(RotaryScheme):
            native = False

    assert OldStyle.config_only is False and RotaryScheme.config_only is True
    state = PatchState(hp.PosEncConfig("yarn", factor=2.0), config_only=True)
    with pytest.warns(DeprecationWarning, match="read PatchState.config_only"):
        assert state.native is True
    old = pickle.loads(pickle.dumps(state, protocol=0).replace(b"config_only", b"native"))  # pickled before it
    assert old.config_only is True and "native" not in vars(old)
    with pytest.warns(DeprecationWarning, match="use loading.config_only"):
        assert loading.native_config({"model_type": "llama"}) is loading.config_only({"model_type": "llama"}) is False
    entry = Entry(get_scheme("nope"), hp.PosEncConfig("nope"), LLAMA, None, keeps_slot=True)
    with pytest.warns(DeprecationWarning, match="read Entry.keeps_slot"):
        assert entry.native_slot is True
