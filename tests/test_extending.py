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
from hf_posenc.adapters.base import ADAPTERS
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


def test_a_patch_state_pickled_before_config_only_was_named_reads_alike():
    """`PatchState.config_only` was `native` before issue 49: a model saved whole (`torch.save`) with it loads."""
    import pickle

    from hf_posenc.state import PatchState

    state = PatchState(hp.PosEncConfig("yarn", factor=2.0), config_only=True)
    old = pickle.loads(pickle.dumps(state, protocol=0).replace(b"config_only", b"native"))  # pickled before it
    assert old.config_only is True and "native" not in vars(old)
