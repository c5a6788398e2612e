"""The sampling plan: which cells (family x patch) run which of transformers' own tests (issue 37).

Every scheme `supports` accepts on a family's test configs is a cell of that family (test_transformers_suites.py
checks it against the probe), plus a per-layer map (NoPE in layer 0, RoPE in 1). A few heavy-hitting cells run the
whole file: ALiBi, the score site where issue 37 found most breakage (on Llama also ALiBi on layer 0 only), and
T5's own relative bias on T5. The others run a selection with every property the issue names, one to four tests
each: generation, cache, padding, save/load, eager vs SDPA, init, training, and the family's own heads and input
shapes; compile for every scheme on Llama (COMPILE_EVERY_SCHEME) and in the whole-file cells elsewhere. Only the
two torch.compile tests that take 35-40 s each stock are left out of every cell. The stock run of a family is the
union of its cells' selections, run in the same session, never a stored baseline.
"""

from __future__ import annotations

import os
from typing import Any

FILES = {
    "llama": "tests/models/llama/test_modeling_llama.py",
    "gpt2": "tests/models/gpt2/test_modeling_gpt2.py",
    "bert": "tests/models/bert/test_modeling_bert.py",
    "t5": "tests/models/t5/test_modeling_t5.py",
}

# 35-40 s each on 2 cores stock, and compile is kept by test_generate_compile_model_forward_fullgraph
SLOW = r"test_generate_compilation_all_outputs|test_static_cache_no_recompile_with_smaller_length"
ALL = rf"::(?!{SLOW})"  # searched in "TestClass::test_method"

PROPERTIES = {  # one or two tests per property, chosen for the contracts each checks
    "generation": r"test_greedy_generate_dict_outputs_use_cache$|test_beam_search_generate$",
    "cache": r"test_generate_with_static_cache$|test_generate_continue_from_past_key_values$",
    "padding": r"test_left_padding_compatibility$|test_sdpa_padding_matches_padding_free_with_position_ids$",
    "save_load": r"test_save_load$|test_base_model_prefix_loads_base_weights$",
    "eager_sdpa": r"test_eager_matches_sdpa_inference_09_fp32_pad_left$|test_can_set_attention_dynamically$"
                  r"|test_config_attn_implementation_setter$|test_attention_outputs$",
    "init": r"test_can_be_initialized_on_meta$|test_init_weights_can_init_buffers$|test_from_pretrained_no_checkpoint$",
    "training": r"test_training_gradient_checkpointing_use_reentrant_false$",
}
# torch.compile(fullgraph) of generate: 3-8 s a cell, the costliest property; every scheme on Llama, where a static
# cache and compiled decoding are what users run, and in the whole-file cells of the other families
COMPILE = r"test_generate_compile_model_forward_fullgraph$"
COMPILE_EVERY_SCHEME = {"llama"}
HEADS = {  # each family's own heads and input shapes (multiple choice, double heads, cross-attention, ...)
    "llama": r"test_sequence_classification_model$",
    "gpt2": r"test_gpt2_double_lm_head_model$|test_cross_attention_respects_encoder_padding_mask$",
    "bert": r"test_for_multiple_choice$|test_model_as_decoder$",
    "t5": r"test_with_sequence_classification_head$|test_decoder_model_past$",
}

# label -> patch; labels are test-id safe. Heavy cells run the whole file.
HEAVY = {
    "llama": {"alibi": "alibi", "alibi@0": {"alibi": [0]}},
    "gpt2": {"alibi": "alibi"},
    "bert": {"alibi": "alibi"},
    "t5": {"t5": "t5"},
}
EXTRA = {family: {"nope@0+rope@1": {"nope": [0], "rope": [1]}} for family in FILES}  # a per-layer map
# every scheme `supports` accepts on a model class of the family's own tests (tree.probe; the suite checks it)
SCHEMES = {
    "llama": "alibi concat cope dynamic fire fope hope kerple learned linear llama3 longrope nope ntk p_rope pope "
             "rope self_extend sinusoidal t5 untied xpos yarn",
    "gpt2": "alibi concat cope dynamic fire fope hope kerple learned linear llama3 longrope nope ntk p_rope pope "
            "rope self_extend sinusoidal t5 untied xpos yarn",
    "bert": "alibi concat dynamic fire fope hope kerple learned linear llama3 longrope nope ntk p_rope pope rope "
            "sinusoidal t5 untied yarn",
    "t5": "alibi concat cope dynamic fire fope hope kerple learned linear llama3 longrope nope ntk p_rope pope "
          "rope self_extend sinusoidal t5 untied xpos yarn",  # cope, self_extend, xpos: T5EncoderModel only
}


# schemes whose options have no default: label and a small value that fits the tests' tiny models (hidden size 32)
REQUIRED_OPTIONS = {"concat": ("concat-d8", {"d_pos": 8}), "dynamic": ("dynamic-x2", {"factor": 2.0}),
                    "linear": ("linear-x2", {"factor": 2.0}), "llama3": ("llama3-x2", {"factor": 2.0}),
                    "longrope": ("longrope-x2", {"factor": 2.0}), "ntk": ("ntk-x2", {"factor": 2.0}),
                    "yarn": ("yarn-x2", {"factor": 2.0})}


def one_scheme(scheme: str) -> tuple[str, Any]:
    """(label, patch) of a one-scheme cell: its name, or options where it has no defaults."""
    if scheme in REQUIRED_OPTIONS:
        label, options = REQUIRED_OPTIONS[scheme]
        return label, {"scheme": scheme, **options}
    return scheme, scheme


# T5's file tests T5Model & co (T5ModelTest) and T5EncoderModel (T5EncoderOnlyModelTest); a selection runs in the
# class whose models the scheme applies to: these three apply to the encoder alone (the plan test checks it)
ENCODER_ONLY = {"t5": {"cope", "self_extend", "xpos"}}
TEST_CLASSES = {"t5": ("T5ModelTest", "T5EncoderOnlyModelTest")}


def selection(family: str, schemes: list[str]) -> str:
    """The property selection of a family for a cell of `schemes`: every property's tests and the family's own,
    in the test class whose models the schemes apply to."""
    compile_ = [COMPILE] if family in COMPILE_EVERY_SCHEME else []
    tests = "|".join([*PROPERTIES.values(), *compile_, HEADS[family]])
    if family not in TEST_CLASSES:
        return f"::(?:{tests})"
    seq2seq, encoder = TEST_CLASSES[family]
    return f"^{encoder if set(schemes) <= ENCODER_ONLY[family] else seq2seq}::(?:{tests})"


def cells(family: str) -> list[dict[str, Any]]:
    """The family's cells as the plugin takes them: {"label", "patch", "select"}."""
    light = dict(one_scheme(name) for name in SCHEMES[family].split() if name not in HEAVY[family])
    found = [{"label": label, "patch": patch, "select": ALL} for label, patch in HEAVY[family].items()]
    found += [{"label": label, "patch": patch, "select": selection(family, schemes_in(patch))}
              for label, patch in {**light, **EXTRA[family]}.items()]
    return found


# `make test` runs a sample of the plan: every scheme in the light cells of one family (in turn over the families
# where it is one), every family's layer map, and one whole-file cell, ALiBi on Llama. The whole plan took 37 min
# of CI's 90 on 2 cores (2026-11-28; Llama 9.5, GPT-2 7); `make test-transformers-full` runs it
# (HF_POSENC_SUITE_PLAN=full).
PLAN = os.environ.get("HF_POSENC_SUITE_PLAN", "sample")
SAMPLED_HEAVY = {"llama": {"alibi"}}


def owners() -> dict[str, str]:
    """scheme -> the family whose light cell runs it in the sample."""
    found: dict[str, str] = {}
    for i, scheme in enumerate(sorted({name for names in SCHEMES.values() for name in names.split()})):
        families = [f for f in FILES if scheme in SCHEMES[f].split() and scheme not in HEAVY[f]]
        if families:
            found[scheme] = families[i % len(families)]
    return found


def sampled(family: str) -> list[dict[str, Any]]:
    """The cells of `family` that `make test` runs."""
    owner = owners()
    return [cell for cell in cells(family)
            if (cell["label"] in SAMPLED_HEAVY.get(family, set()) if cell["select"] == ALL
                else cell["label"] in EXTRA[family] or owner.get(schemes_in(cell["patch"])[0]) == family)]


def planned(family: str) -> list[dict[str, Any]]:
    """The cells this session runs: the sample, or every cell where HF_POSENC_SUITE_PLAN=full."""
    return cells(family) if PLAN == "full" else sampled(family)


def stock_cell(chosen: list[dict[str, Any]]) -> dict[str, Any]:
    """The stock run of some cells of one family: the union of their selections, unpatched."""
    selects = {cell["select"] for cell in chosen}
    return {"label": "stock", "patch": None, "select": ALL if ALL in selects else "|".join(sorted(selects))}


def schemes_in(patch: Any) -> list[str]:
    """The scheme names a cell's patch installs."""
    if isinstance(patch, str):
        return [patch]
    return [patch["scheme"]] if "scheme" in patch else list(patch)
