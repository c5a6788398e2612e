"""The real SmolLM2-135M-Instruct (its package's GGUF, which llama.cpp's own converter wrote) exported by hf-posenc
(issue 48): unpatched, the file says what the converter's says; patched to YaRN x2 and to NoPE in every 4th layer,
llama.cpp generates the same greedy tokens as transformers + hf-posenc past the original length.

Slow (CPU, one thread: a few minutes): the context past SmolLM2's own 8192 positions would take ~10 min per engine
here, so the YaRN patch sets `original_max_position_embeddings=512` and the prompt runs past it (~700 tokens);
what runs is the same YaRN code path with the same keys, at a shorter length.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hf_posenc as hp
from hf_posenc.data import long_text
from hf_posenc.loading import load_model, load_tokenizer
from hf_posenc.models import model_source
from hf_posenc.serving.gguf.export import export_gguf
from test_gguf import greedy, needs_llamacpp, run_llamacpp

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("gguf-real")]
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def smollm2():
    return load_model("smollm2", task="saved", dtype=torch.float32), load_tokenizer("smollm2")


def reference():
    from gguf import GGUFReader

    folder, kwargs = model_source("smollm2")
    return GGUFReader(f"{folder}/{kwargs['gguf_file']}")


def test_the_stock_export_says_what_llama_cpp_s_converter_wrote(smollm2, tmp_path):
    from gguf import GGUFReader
    from gguf.quants import dequantize

    model, tokenizer = smollm2
    ours, theirs = GGUFReader(export_gguf(model, tmp_path / "m.gguf", "f16", tokenizer=tokenizer)), reference()
    same = [k for k in theirs.fields if k.startswith(("llama.", "tokenizer.")) and k != "tokenizer.ggml.pre"]
    for key in same:
        assert key in ours.fields, key
        mine, want = ours.fields[key], theirs.fields[key]
        if key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type"):
            assert [mine.contents(i) for i in range(len(mine.data))] == [want.contents(i) for i in range(len(want.data))], key
        else:
            assert mine.contents() == pytest.approx(want.contents()), key
    # transformers' GGUF tokenizer keeps byte-level BPE but drops SmolLM2's digit split: its tokens are gpt-2's
    assert (ours.fields["tokenizer.ggml.pre"].contents(), theirs.fields["tokenizer.ggml.pre"].contents()) == ("gpt-2", "smollm")
    mine, want = {t.name: t for t in ours.tensors}, {t.name: t for t in theirs.tensors}
    assert set(mine) == set(want)
    for name in ("blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.29.attn_k.weight"):  # the q/k row order
        expected = dequantize(want[name].data, want[name].tensor_type).reshape(mine[name].data.shape)
        np.testing.assert_allclose(mine[name].data.astype(np.float32), expected, rtol=2e-3, atol=1e-4)


CELLS = {  # name -> (patch, prompt tokens)
    "yarn2-past-512": ({"scheme": "yarn", "factor": 2.0, "original_max_position_embeddings": 512}, 700),
    "nope-every-4th-layer": ({"scheme": "nope", "layers": list(range(3, 30, 4))}, 200),
}


@needs_llamacpp
def test_patched_smollm2_runs_the_same_greedy_tokens_in_llama_cpp(smollm2, tmp_path):
    model, tokenizer = smollm2
    ids = tokenizer(long_text("kjv")[:20_000])["input_ids"]
    cells, expected = [], {}
    for name, (options, length) in CELLS.items():
        options = dict(options)
        hp.patch(model, options.pop("scheme"), **options)
        expected[name] = greedy(model, ids[:length], NEW_TOKENS)
        path = export_gguf(model, tmp_path / f"{name}.gguf", tokenizer=tokenizer)
        cells.append({"gguf": str(path), "prompt": ids[:length], "new_tokens": NEW_TOKENS, "n_ctx": 1024, "top": 5})
        hp.unpatch(model)
    for (name, (_, length)), answer in zip(CELLS.items(), run_llamacpp(tmp_path, cells)):
        assert "error" not in answer, (name, answer.get("error"))
        assert answer["tokens"] == expected[name], (name, tokenizer.decode(answer["tokens"]), tokenizer.decode(expected[name]))
        print(f"{name}: {NEW_TOKENS} greedy tokens equal after {length}: {tokenizer.decode(expected[name])!r}")
