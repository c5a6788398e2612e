"""bf16 models (issue 32): a patch on a model loaded in bf16 is as close to the same model in fp32 as the stock
model is. The bf16 twin has the fp32 model's weights, loaded the way `from_pretrained(dtype=torch.bfloat16)`
loads them (`conftest.tiny_model`), so the patch's own modules are the only new source of error."""

from __future__ import annotations

import pytest
import torch

import hf_posenc as hp
from conftest import tiny_model
from matrix import CELLS, SCHEMES, ids, patched, row, scheme_of

BF16 = torch.bfloat16


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got.float() - expected).norm() / expected.norm())


@row(CELLS, per_label=1)
def test_bf16_patch_keeps_frequency_buffers_fp32(arch, label):
    """Buffers the patch computes (not saved) that hold values (frequencies, slopes, decays) are the fp32 patch's,
    bit for bit; only zero buffers, which name the model's dtype, and saved ones, which are weights, follow it."""
    full, half = patched(arch, label), patched(arch, label, dtype=BF16)
    expected, saved = dict(full.named_buffers()), half.state_dict()
    checked = 0
    for name, buffer in half.named_buffers():
        if buffer.is_floating_point() and name not in saved and bool(buffer.any()):
            assert buffer.dtype == torch.float32, name
            assert torch.equal(buffer, expected[name]), name
            checked += 1
    if scheme_of(label) in ("xpos", "self_extend", "alibi"):
        assert checked, "the scheme's buffers were not found"


@row(CELLS, per_label=1)
def test_bf16_logits_are_as_close_to_fp32_as_the_stock_models(arch, label):
    """The patched model's bf16 error over 48 tokens is bounded by the stock model's own (bf16 matmuls in a peaky
    tiny model), not by an absolute number: the patch may not add error of its own."""
    x = ids(batch=1, length=48, seed=3)
    with torch.no_grad():
        stock = relative_error(tiny_model(arch, dtype=BF16)(x).logits, tiny_model(arch)(x).logits)
        error = relative_error(patched(arch, label, dtype=BF16)(x).logits, patched(arch, label)(x).logits)
    assert error <= 3 * stock + 0.01, f"bf16 relative error {error:.4f}, stock model {stock:.4f}"


@pytest.mark.parametrize("scheme,options", [("xpos", {"theta": 5e5, "scale_base": 4096.0}),
                                            ("self_extend", {"theta": 5e5, "group": 4, "window": 256})])
def test_bf16_rotation_inside_attention_at_1500_tokens(scheme, options):
    """Self-Extend and xPos rotate inside attention with their own frequencies: at 1500 tokens bf16 ones turned
    the far keys by up to a radian (relative error 3.5x and 4.3x the stock model's before the fix)."""
    x = ids(batch=1, length=1500, seed=6)
    with torch.no_grad():
        stock = relative_error(tiny_model("llama", dtype=BF16)(x).logits, tiny_model("llama")(x).logits)
        full = hp.patch(tiny_model("llama"), scheme, **options)(x).logits
        error = relative_error(hp.patch(tiny_model("llama", dtype=BF16), scheme, **options)(x).logits, full)
    assert error <= 2 * stock, f"bf16 relative error {error:.4f}, stock model {stock:.4f}"
