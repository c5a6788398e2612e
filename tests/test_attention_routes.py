"""Which backend a call takes on CUDA, and the GPU-only paths (issue 32), run on CPU: the routing decisions
with CPU standing in for a device that has the kernels, FlexAttention's backward graph checked by the
validator Inductor's CUDA lowering runs, and flash-attn through a stand-in that computes its documented
maths (tests/stand_ins/flash_attn)."""

from __future__ import annotations

import pytest
import torch
from functorch.compile import default_partition, make_boxed_func
from torch._dynamo.backends.common import aot_autograd
from torch._inductor.kernel.flex.flex_attention import validate_joint_graph
from torch.nn.attention.flex_attention import flex_attention

from hf_posenc import fast_attention
from hf_posenc.errors import PosEncError
from hf_posenc.fast_attention import MaskSpec, backends, biased_attention, choose_backend
from hf_posenc.fast_attention.terms import Call
from test_fast_attention import LEARNED, make_bias

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
