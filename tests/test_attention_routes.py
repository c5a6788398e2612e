"""Which backend a call takes on CUDA, and the GPU-only paths (issue 32), run on CPU: the routing decisions
with CPU standing in for a device that has the kernels, FlexAttention's backward graph checked by the
validator Inductor's CUDA lowering runs, and flash-attn through a stand-in that computes its documented
maths (tests/stand_ins/flash_attn)."""

from __future__ import annotations

import importlib
import logging
import sys
from pathlib import Path

import pytest
import torch
from functorch.compile import default_partition, make_boxed_func
from torch._dynamo.backends.common import aot_autograd
from torch._inductor.kernel.flex.flex_attention import validate_joint_graph
from torch.nn.attention.flex_attention import flex_attention

from hf_posenc import attention, fast_attention
from hf_posenc.errors import PosEncError
from hf_posenc.fast_attention import MaskSpec, backends, biased_attention, choose_backend
from hf_posenc.fast_attention.terms import Call
from matrix import ids, patched
from test_fast_attention import LEARNED, inputs, left_padded, make_bias, make_case, on, reference, run

B, H, D, L = 1, 4, 16, 128  # one flex block: auto's shortest flex call


def grad_call(term: str) -> Call:
    """A call that trains the term's parameters (q, k, v need no gradient: CPU flex refuses those)."""
    bias = make_bias(term)
    query, key, value = (torch.randn(B, H, L, D, generator=torch.Generator().manual_seed(i)) for i in range(3))
    pos = torch.arange(L)[None]
    call = Call(query, key, value, pos, pos, bias, MaskSpec(), D**-0.5, 0.0)
    assert call.needs_grad
    return call


def flex_backward_graphs(call: Call) -> list[torch.fx.Graph]:
    """The score_mod joint graphs that Inductor's lowering of flex_attention_backward validates, built as
    torch builds them (dynamo lifts the captured parameters, AOT autograd traces forward and backward
    together), with no kernel compiled."""
    graphs = []

    def partition(joint: torch.fx.GraphModule, inputs, **kwargs):
        for node in joint.graph.nodes:
            if node.target is torch.ops.higher_order.flex_attention_backward:
                graph = getattr(joint, node.args[8].target).graph  # the joint_graph argument
                graph.eliminate_dead_code()  # as the lowering does before validating
                graphs.append(graph)
        return default_partition(joint, inputs, **kwargs)

    backend = aot_autograd(fw_compiler=lambda gm, _: make_boxed_func(gm), partition_fn=partition)
    args, kwargs = backends.flex_arguments(call)
    with torch._dynamo.config.patch(recompile_limit=backends.RECOMPILE_LIMIT):  # flex tests ran before
        torch.compile(flex_attention, backend=backend, fullgraph=True)(*args, **kwargs)
    return graphs


@pytest.fixture
def flex_backward_here(monkeypatch):
    """CPU stands in for a device where auto takes flex and torch has its backward (CUDA)."""
    monkeypatch.setattr(fast_attention, "FLEX_DEVICES", ("cpu",))
    monkeypatch.setattr(fast_attention, "FLEX_BACKWARD_DEVICES", ("cpu",))


def test_grad_calls_go_only_where_flex_can_lower_the_backward(flex_backward_here):
    """FIRE's score_mod indexes its MLP weights once per hidden unit; Inductor refuses that backward
    ("multiple indexing operations on the same tensor that requires gradients") inside loss.backward(),
    past any fallback. Each trainable term's grad call must be routed where the validator accepts it."""
    accepted = {}
    for term in LEARNED + ["kerple_power"]:
        call = grad_call(term)
        if backends.flex_arguments(call)[1]["score_mod"] is None:  # a term folded into q and k (untied)
            assert choose_backend(call) == "flex", term
            continue
        graphs = flex_backward_graphs(call)
        assert graphs, term
        try:
            for graph in graphs:
                validate_joint_graph(graph)
            accepted[term] = True
        except NotImplementedError as error:
            assert "multiple indexing operations" in str(error)
            accepted[term] = False
        assert (choose_backend(call) == "flex") == accepted[term], term
    assert accepted == {"t5": True, "fire": False, "kerple": True, "kerple_power": True}
    fire = grad_call("fire")
    with torch.no_grad():  # inference never builds the backward: FIRE keeps flex
        assert choose_backend(fire) == "flex"
    with pytest.raises(PosEncError, match="cannot lower the backward of FireBias"):
        biased_attention(fire.query, fire.key, fire.value, q_pos=fire.q_pos, k_pos=fire.k_pos, bias=fire.bias,
                         mask=fire.mask, backend="flex")


# ------------------------------------------------------------------ flash-attn, through the CPU stand-in

STAND_INS = Path(__file__).parent / "stand_ins"


@pytest.fixture
def flash_stand_in(monkeypatch):
    """flash_attn importable as the CPU stand-in, and CPU a device the flash path applies to."""
    monkeypatch.syspath_prepend(str(STAND_INS))
    monkeypatch.setattr(backends, "FLASH_DEVICES", ("cpu",))
    previous = sys.modules.pop("flash_attn", None)
    module = importlib.import_module("flash_attn")
    assert Path(module.__file__).is_relative_to(STAND_INS)
    module.CALLS.clear()
    backends.flash_runs.cache_clear()
    yield module
    backends.flash_runs.cache_clear()
    sys.modules.pop("flash_attn")
    if previous is not None:
        sys.modules["flash_attn"] = previous


@pytest.mark.parametrize("case", ["causal", "window", "continue"])
def test_flash_alibi_equals_the_reference(case, flash_stand_in):
    """The kernel-level contract: flash's bottom-right ALiBi by index is the scheme's bias where auto takes it."""
    bias, case = make_bias("alibi"), make_case(case)
    query, key, value = inputs(case)
    call = Call(query.bfloat16(), key.bfloat16(), value.bfloat16(), case.q_pos, case.k_pos, bias, case.spec, D**-0.5, 0.0)
    with torch.no_grad():
        assert choose_backend(call) == "flash_alibi"
        got = run(bias, case, "flash_alibi", query.bfloat16(), key.bfloat16(), value.bfloat16())
    assert len(flash_stand_in.CALLS) == 2  # the device's probe, then the call
    torch.testing.assert_close(got.float(), reference(bias, case, query, key, value), atol=6e-2, rtol=0)


def test_flash_path_on_a_patched_alibi_model_equals_dense(flash_stand_in, monkeypatch):
    """A tiny peaky ALiBi model in bf16 under auto, every call fused (prefill on flash, decode steps
    chunked): logits and greedy generate match the dense path to bf16 rounding."""
    monkeypatch.setattr(attention, "DENSE_SCORES", 1)
    model = patched("llama", "alibi").to(torch.bfloat16)
    tokens = ids(batch=1, length=16, seed=5)
    with torch.no_grad():
        expected = on("dense", lambda: model(tokens).logits.float())
        assert not flash_stand_in.CALLS
        got = on("auto", lambda: model(tokens).logits.float())
        assert len(flash_stand_in.CALLS) == 1 + model.config.num_hidden_layers  # the probe, then each layer
        assert (expected - on("dense", lambda: patched("llama", "nope").to(torch.bfloat16)(tokens).logits.float())
                ).abs().max() > 1.0  # ALiBi moves these logits far past the tolerance below
        torch.testing.assert_close(got, expected, atol=0.1, rtol=0.02)
        greedy = dict(do_sample=False, max_new_tokens=6, pad_token_id=0, eos_token_id=None, output_scores=True,
                      return_dict_in_generate=True)
        dense = on("dense", lambda: model.generate(tokens, **greedy))
        flash_stand_in.CALLS.clear()
        fused = on("auto", lambda: model.generate(tokens, **greedy))
    assert len(flash_stand_in.CALLS) == model.config.num_hidden_layers  # the prefill
    assert torch.equal(fused.sequences, dense.sequences)
    torch.testing.assert_close(torch.stack(fused.scores).float(), torch.stack(dense.scores).float(), atol=0.1, rtol=0.02)


def test_a_forced_backend_falls_back_once_logged_for_calls_it_cannot_take(flash_stand_in, caplog, monkeypatch):
    """HF_POSENC_ATTENTION=flash_alibi: decode steps (one query, no mask) and padded batches (bool masks) run
    where auto would run them, with one log line for the whole process; the calls flash can take stay on it."""
    monkeypatch.setattr(fast_attention, "_fell_back", set())  # as in a fresh process
    model = patched("llama", "alibi").to(torch.bfloat16)
    batch, mask = left_padded()
    greedy = dict(do_sample=False, max_new_tokens=4, pad_token_id=0, eos_token_id=None, output_scores=True,
                  return_dict_in_generate=True)

    def generate(rows: slice):
        return lambda: model.generate(batch[rows], attention_mask=mask[rows], **greedy)

    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="hf_posenc"):
        for rows in (slice(0, 1), slice(0, 2)):  # one unpadded prompt, then a left-padded batch
            expected = on("dense", generate(rows))
            got = on("flash_alibi", generate(rows))
            assert torch.equal(got.sequences, expected.sequences)
            torch.testing.assert_close(torch.stack(got.scores).float(), torch.stack(expected.scores).float(),
                                       atol=0.1, rtol=0.02)
    assert len(flash_stand_in.CALLS) == 1 + model.config.num_hidden_layers  # the probe, the unpadded prefill
    said = [record.getMessage() for record in caplog.records if "flash_alibi" in record.getMessage()]
    assert len(said) == 1 and "falling back" in said[0], said


def test_auto_takes_flash_only_where_a_probe_call_ran(flash_stand_in, monkeypatch):
    """flash-attn imports on GPUs it has no kernels for (T4, V100: before Ampere) and in wheels built for another
    torch, and fails only when called: auto takes it only after a tiny call ran on the device, once per device."""
    monkeypatch.setattr(flash_stand_in, "CAPABILITY", (7, 5))  # a T4
    monkeypatch.setattr(attention, "DENSE_SCORES", 1)
    model = patched("llama", "alibi").to(torch.bfloat16)
    tokens = ids(batch=1, length=16, seed=5)
    with torch.no_grad():
        expected = on("dense", lambda: model(tokens).logits)
        for _ in range(2):
            torch.testing.assert_close(on("auto", lambda: model(tokens).logits), expected, atol=0.1, rtol=0.02)
    assert len(flash_stand_in.CALLS) == 1  # the probe, once for the device


def test_deterministic_algorithms_keep_grad_calls_off_flex_and_make_flash_deterministic(flash_stand_in,
                                                                                         flex_backward_here):
    """training.deterministic: flex's backward adds captured tensors' gradients atomically, so grad calls go
    chunked; flash-attn's backward is deterministic only when asked (deterministic=True)."""
    case = make_case("causal")
    bf16 = [x.bfloat16() for x in inputs(case)]

    def flash_call() -> dict:
        with torch.no_grad():
            run(make_bias("alibi"), case, "flash_alibi", *bf16)
        return flash_stand_in.CALLS[-1]

    call = grad_call("t5")
    assert choose_backend(call) == "flex" and flash_call()["deterministic"] is False
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert choose_backend(call) == "chunked"
        with torch.no_grad():  # inference has no backward: flex stays
            assert choose_backend(call) == "flex"
        assert flash_call()["deterministic"] is True
    finally:
        torch.use_deterministic_algorithms(before)


@pytest.mark.parametrize("name", ["window", "left_padding", "continue"])  # band (Toeplitz) rows and masked rows
@pytest.mark.parametrize("term", ["none", "alibi", "fire"])
def test_chunked_sends_no_grouped_heads_with_a_mask_to_sdpa(term, name, monkeypatch):
    """On CUDA, sdpa's enable_gqa with an attn_mask runs only on its math kernel: the chunked path repeats
    grouped key/value heads wherever it passes a mask, and gives what keys repeated by the caller give."""
    calls, sdpa = [], torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *args, **kwargs: calls.append(kwargs) or sdpa(*args, **kwargs))
    monkeypatch.setattr(backends, "CHUNK_ELEMENTS", 4096)  # several query blocks
    bias, case = make_bias(term), make_case(name)
    query, key, value = inputs(case)
    groups = query.shape[1] // key.shape[1]
    assert groups > 1
    with torch.no_grad():
        grouped = run(bias, case, "chunked", query, key, value)
        assert len(calls) > 1 and all(call.get("attn_mask") is not None for call in calls)
        assert not any(call.get("enable_gqa") for call in calls)
        repeated = run(bias, case, "chunked", query, key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1))
    assert torch.equal(grouped, repeated)
