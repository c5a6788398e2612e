"""GGUF export for llama.cpp (issue 48): every scheme is written so that llama.cpp computes what transformers +
hf-posenc compute, token for token, or refused by name before anything is written.

The decisions and the file are tested everywhere; the engine tests run the files in llama.cpp itself (xllamacpp's
prebuilt CPU wheel, in .venv-llamacpp, which `make test-llamacpp` builds) through tests/llamacpp_worker.py, and are
skipped by name where that venv is absent. Tiny peaky Llama-family models (hidden 256, head_dim 64,
initializer_range 0.2, a 259-token byte-level BPE vocabulary) patched with hf-posenc, exported, run greedily.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest
import torch
import transformers

import hf_posenc as hp
from hf_posenc.config import required_options
from hf_posenc.errors import PosEncError
from hf_posenc.folders import GGUF_MARK
from hf_posenc.serving.gguf.export import export_gguf
from hf_posenc.serving.gguf.targets import REFUSED, TARGETS, target_of

pytestmark = pytest.mark.xdist_group("gguf")  # one worker builds the module fixture

ROOT = Path(__file__).resolve().parents[1]
LLAMACPP = ROOT / ".venv-llamacpp" / "bin" / "python"
WORKER = Path(__file__).with_name("llamacpp_worker.py")
needs_llamacpp = pytest.mark.skipif(not LLAMACPP.is_file(), reason="llama.cpp (xllamacpp) is not installed: the "
                                    "engine tests run with .venv-llamacpp (make test-llamacpp)")
GUIDE = ROOT / "docs" / "guide" / "gguf.md"
GENERATE = ".venv-llamacpp/bin/python scripts/llamacpp-generate"  # how the guide, `export --help` and cards run a file
NEW_TOKENS = 32
PROMPT_LENGTH = 40
# top-5 logprobs, llama.cpp (ggml CPU kernels, f32 weights and KV cache) against transformers fp32 sdpa on the same
# tokens: measured max gap 1.3e-4 over the cells below (printed by the test); a dropped or wrong position scheme
# moves them by O(1)
LOGPROB_TOLERANCE = 1e-3

# (model type, scheme, options, layers): written and run token-equal
EXPORTED = [
    ("llama", None, {}, 2),
    ("llama", "rope", {"theta": 500.0}, 2),
    ("llama", "rope", {"partial": 0.5}, 2),
    ("llama", "ntk", {"factor": 2.0}, 2),
    ("llama", "linear", {"factor": 2.0}, 2),
    ("llama", "yarn", {"factor": 2.0}, 2),
    ("llama", "yarn", {"factor": 4.0, "attention_factor": 1.3}, 2),
    ("llama", "llama3", {"factor": 4.0, "original_max_position_embeddings": 64}, 2),
    ("llama", "p_rope", {"p": 0.5}, 2),
    ("llama", "alibi", {}, 2),
    ("llama", "nope", {}, 2),
    ("llama", "nope", {"layers": [3]}, 4),
    ("mistral", "yarn", {"factor": 2.0}, 2),
    ("qwen2", "rope", {"theta": 500.0}, 2),
    ("qwen2", "yarn", {"factor": 2.0}, 2),
]
# (model type, scheme, options, what the refusal names)
REFUSED_OPTIONS = [
    ("llama", "yarn", {"factor": 2.0, "beta_fast": 16.0}, "option beta_fast"),
    ("llama", "yarn", {"factor": 2.0, "partial": 0.5}, "option partial"),
    ("llama", "alibi", {"max_bias": 4.0}, "option max_bias"),
    ("llama", "nope", {"layers": [1]}, "per-layer patch"),
    ("llama", "rope", {"theta": 500.0, "layers": [0]}, "per-layer patch"),
    ("qwen2", "alibi", {}, "biases"),
    ("qwen2", "p_rope", {"p": 0.5}, "no rope_freqs tensor"),
]


def cell_id(cell: tuple) -> str:
    return "-".join(str(part) for part in (cell[0], cell[1] or "stock", *(f"{k}{v}" for k, v in cell[2].items())))


SPECIAL = (256, 257, 258, 259)  # <s>, </s>, <pad>, and the padding row of the vocabulary


def byte_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """A GPT-2 style byte-level BPE (llama.cpp's 'gpt2' vocab): the 128 ASCII bytes, 128 merged letter pairs, three
    special tokens. Every token is whole UTF-8, so llama.cpp's server reports each generated token on its own."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    symbols = list(bytes_to_unicode().items())
    vocab = {char: byte for byte, char in symbols if byte < 128}
    merges = [(a, b) for a in "abcdefghijklmnop" for b in "abcdefgh"]
    vocab |= {a + b: 128 + i for i, (a, b) in enumerate(merges)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>",
                                                     pad_token="<pad>")
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    return tokenizer


def peaky(model_type: str, layers: int = 2) -> torch.nn.Module:
    """A tiny model whose greedy tokens depend on positions (large weights, head_dim 64 as real models); the output
    rows of the special tokens are zero, so greedy decoding (max logit > 0 here) never emits them."""
    torch.manual_seed(0)
    config_class = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
                    "qwen2": transformers.Qwen2Config}[model_type]
    extra = {"sliding_window": None} if model_type != "llama" else {}
    config = config_class(vocab_size=260, hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                          num_hidden_layers=layers, intermediate_size=512, max_position_embeddings=512,
                          tie_word_embeddings=model_type == "llama", initializer_range=0.2, bos_token_id=256,
                          eos_token_id=257, pad_token_id=258, **extra)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        model.lm_head.weight[list(SPECIAL)] = 0.0
        if model_type == "qwen2":  # biases that matter
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.2)
    return model


def patched(cell: tuple) -> torch.nn.Module:
    model_type, scheme, options, layers = cell
    model = peaky(model_type, layers)
    return hp.patch(model, scheme, **options) if scheme else model


# ---------------------------------------------------------------- decisions and files, everywhere


@pytest.mark.parametrize("scheme", [s for s in hp.list_schemes() if s not in TARGETS])
def test_every_other_scheme_is_refused_by_name_and_nothing_is_written(tmp_path, scheme):
    if not hp.supports(transformers.LlamaConfig(), scheme):
        pytest.skip(f"llama models do not take {scheme}")
    options = {name: {"factor": 2.0, "d_pos": 16}[name] for name in required_options(scheme)}
    model = hp.patch(peaky("llama"), scheme, **options)
    out = tmp_path / "m.gguf"
    with pytest.raises(PosEncError) as err:
        export_gguf(model, out, tokenizer=byte_tokenizer())
    message = str(err.value)
    assert f"scheme {scheme!r}" in message and "llama.cpp has" in message and "\n" not in message
    assert REFUSED[scheme] in message
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("cell", REFUSED_OPTIONS, ids=lambda c: cell_id(c[:3]))
def test_options_past_what_llama_cpp_computes_are_refused_naming_option_and_nearest(tmp_path, cell):
    model_type, scheme, options, named = cell
    model = hp.patch(peaky(model_type), scheme, **options)
    with pytest.raises(PosEncError, match=named) as err:
        export_gguf(model, tmp_path / "m.gguf", tokenizer=byte_tokenizer())
    assert f"scheme {scheme!r}" in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_a_path_hf_posenc_did_not_write_is_never_replaced(tmp_path):
    model, tokenizer = peaky("llama"), byte_tokenizer()
    foreign = tmp_path / "theirs.gguf"
    foreign.write_bytes(b"not ours")
    with pytest.raises(PosEncError, match="hf-posenc did not write it"):
        export_gguf(model, foreign, tokenizer=tokenizer)
    assert foreign.read_bytes() == b"not ours"
    ours = export_gguf(model, tmp_path / "ours.gguf", tokenizer=tokenizer)
    first = ours.stat().st_mtime_ns
    with pytest.raises(PosEncError, match="pass overwrite=True"):
        export_gguf(model, ours, tokenizer=tokenizer)
    export_gguf(hp.patch(model, "rope", theta=500.0), ours, tokenizer=tokenizer, overwrite=True)  # ours: replaced
    assert ours.stat().st_mtime_ns >= first and sorted(p.name for p in tmp_path.iterdir()) == ["ours.gguf", "theirs.gguf"]
    with pytest.raises(PosEncError, match="dtype 'q4'"):
        export_gguf(model, tmp_path / "q.gguf", dtype="q4", tokenizer=tokenizer)
    with pytest.raises(PosEncError, match="without a tokenizer"):
        export_gguf(model, tmp_path / "t.gguf")
    assert not (tmp_path / "q.gguf").exists() and not (tmp_path / "t.gguf").exists()


def test_the_file_holds_the_keys_and_tensors_llama_cpp_reads(tmp_path):
    from gguf import GGUFReader

    model = hp.patch(peaky("llama"), "llama3", factor=4.0, original_max_position_embeddings=64)
    reader = GGUFReader(export_gguf(model, tmp_path / "m.gguf", tokenizer=byte_tokenizer()))
    fields = {name: field.contents() for name, field in reader.fields.items()}
    assert fields["general.architecture"] == "llama" and fields["llama.rope.dimension_count"] == 64
    assert fields["tokenizer.ggml.model"] == "gpt2" and fields["tokenizer.ggml.pre"] == "gpt-2"
    assert json.loads(fields[GGUF_MARK])["posenc"]["scheme"] == "llama3"
    names = {t.name: t for t in reader.tensors}
    assert "output.weight" not in names  # tied: llama.cpp reuses token_embd
    freqs = torch.tensor(names["rope_freqs.weight"].data.copy())
    # Llama 3.1's rule: high frequencies kept (1), low ones divided by the factor (4)
    assert freqs[0] == 1.0 and freqs[-1] == pytest.approx(4.0) and len(freqs) == 32
    q = torch.tensor(names["blk.0.attn_q.weight"].data.copy())
    original = model.model.layers[0].self_attn.q_proj.weight.detach()
    assert not torch.equal(q, original) and torch.equal(q.sort(0).values, original.sort(0).values)  # rows permuted


# ---------------------------------------------------------------- with llama.cpp


def prompt() -> list[int]:
    return torch.randint(0, 256, (PROMPT_LENGTH,), generator=torch.Generator().manual_seed(1)).tolist()


def run_llamacpp(root: Path, cells: list[dict]) -> list[dict]:
    (root / "cells.json").write_text(json.dumps(cells))
    proc = subprocess.run([str(LLAMACPP), str(WORKER), str(root / "cells.json"), str(root / "out.json")],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:]
    return json.loads((root / "out.json").read_text())


def greedy(model: torch.nn.Module, ids: list[int], new_tokens: int) -> list[int]:
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([ids]), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             do_sample=False, pad_token_id=0)
    return out[0, len(ids):].tolist()


def logprob_gap(model: torch.nn.Module, ids: list[int], tokens: list[int], top: list[dict[str, float]]) -> float:
    with torch.no_grad():
        logprobs = model(torch.tensor([ids + tokens])).logits[0, len(ids) - 1: -1].float().log_softmax(-1)
    return max(abs(logprobs[step, int(t)].item() - lp) for step, top_k in enumerate(top) for t, lp in top_k.items())


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> dict[str, tuple[torch.nn.Module, dict]]:
    """Every exported cell, written and run by one llama.cpp worker: id -> (patched model, llama.cpp's answer)."""
    root, tokenizer = tmp_path_factory.mktemp("gguf"), byte_tokenizer()
    models = {cell_id(c): patched(c) for c in EXPORTED}
    cells = [{"gguf": str(export_gguf(m, root / f"{name}.gguf", tokenizer=tokenizer)), "prompt": prompt(),
              "new_tokens": NEW_TOKENS, "n_ctx": 512, "top": 5} for name, m in models.items()]
    return {name: (models[name], answer) for name, answer in zip(models, run_llamacpp(root, cells))}


@needs_llamacpp
@pytest.mark.parametrize("cell", EXPORTED, ids=cell_id)
def test_llama_cpp_runs_the_export_token_for_token(engine, cell):
    model, answer = engine[cell_id(cell)]
    assert "error" not in answer, answer.get("error")
    ids = prompt()
    expected = greedy(model, ids, NEW_TOKENS)
    assert not set(expected) & set(SPECIAL)  # what the worker's text path could not report
    assert answer["tokens"] == expected
    gap = logprob_gap(model, ids, expected, answer["top_logprobs"])
    print(f"{cell_id(cell)}: {NEW_TOKENS} greedy tokens equal, top-5 logprob gap {gap:.2e}")
    assert gap < LOGPROB_TOLERANCE


@needs_llamacpp
def test_llama_cpp_runs_the_exports_differently_from_the_stock_model(engine):
    """A control: the patched exports differ from the unpatched one in llama.cpp too (no silent stock RoPE)."""
    stock = engine[cell_id(EXPORTED[0])][1]["tokens"]
    differing = [name for name, (_, answer) in engine.items() if answer.get("tokens") != stock]
    assert len(differing) >= len(engine) - 2  # at most a scaling that changes nothing within 72 positions


def test_push_stages_the_gguf_with_its_llama_cpp_command_only_when_asked(tmp_path):
    from hf_posenc.cli import main

    model, tokenizer = hp.patch(peaky("llama"), "yarn", factor=2.0), byte_tokenizer()
    model.save_pretrained(tmp_path / "m")
    gguf = export_gguf(model, tmp_path / "m.gguf", tokenizer=tokenizer)
    assert main(["push", str(tmp_path / "m"), "me/m", "--dry-run", str(tmp_path / "plain")]) == 0
    assert not list((tmp_path / "plain").glob("*.gguf"))
    assert main(["push", str(tmp_path / "m"), "me/m", "--dry-run", str(tmp_path / "staged"), "--gguf", str(gguf)]) == 0
    assert (tmp_path / "staged" / "m.gguf").read_bytes() == gguf.read_bytes()
    card = (tmp_path / "staged" / "README.md").read_text()
    assert "llama-cli -m m.gguf -c 1024" in card and "YaRN x2" in card and "`llama` architecture" in card
    other = export_gguf(peaky("llama"), tmp_path / "stock.gguf", tokenizer=tokenizer)
    assert main(["push", str(tmp_path / "m"), "me/m", "--dry-run", str(tmp_path / "wrong"), "--gguf", str(other)]) == 1
    assert main(["push", str(tmp_path / "m"), "me/m", "--dry-run", str(tmp_path / "foreign"), "--gguf",
                 str(tmp_path / "m" / "config.json")]) == 1
    assert not (tmp_path / "wrong").exists() and not (tmp_path / "foreign").exists()


def shown_commands(text: str) -> tuple[list[str], int, int]:
    """The llamacpp-generate command a text shows (as argv; a trailing comment dropped), and the lines where it and
    llama-cli stand."""
    lines = [line.strip() for line in text.splitlines()]
    found = [i for i, line in enumerate(lines) if line.startswith(GENERATE)]
    assert len(found) == 1, f"{len(found)} llamacpp-generate commands in {text[:200]!r}..."
    return shlex.split(lines[found[0]], comments=True), found[0], next(i for i, line in enumerate(lines)
                                                                        if line.startswith("llama-cli -m "))


def test_the_guide_help_and_card_show_the_same_run_command_before_llama_cli(capsys):
    """The command that runs an export after the README's set-up is the one the guide shows (and the test below
    runs), in `export --help` and the model card alike, each before llama.cpp's own llama-cli."""
    from hf_posenc.cli import main
    from hf_posenc.hub import gguf_section

    guide, guide_at, guide_cli = shown_commands(GUIDE.read_text(encoding="utf-8"))
    with pytest.raises(SystemExit):
        main(["export", "--help"])
    shown, help_at, help_cli = shown_commands(capsys.readouterr().out)
    assert shown == guide and guide_at < guide_cli and help_at < help_cli
    mark = {"dtype": "f32", "kept": "YaRN x2", "architecture": "llama", "context": 1024}
    card, card_at, card_cli = shown_commands(gguf_section("m.gguf", mark))
    assert card == [*guide[:2], "m.gguf", *guide[3:]] and card_at < card_cli
    assert guide[2].endswith(".gguf") and len(guide) == 4  # python, script, file, prompt: nothing else to fill in


@needs_llamacpp
def test_llama_cpp_runs_the_guides_command_on_an_export_with_its_context_and_prints_the_greedy_completion(tmp_path):
    """After `hf-posenc export`, the guide's command (run as written, on this file) prints what transformers +
    hf-posenc generate greedily from its prompt, with the context the export was written for."""
    from hf_posenc.cli import main
    from hf_posenc.folders import gguf_mark

    model, tokenizer = hp.patch(peaky("llama"), "yarn", factor=2.0), byte_tokenizer()
    model.save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    gguf = tmp_path / "m.gguf"
    assert main(["export", str(tmp_path / "m"), "--gguf", str(gguf)]) == 0
    command, _, _ = shown_commands(GUIDE.read_text(encoding="utf-8"))
    command[2] = str(gguf)
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    expected = tokenizer.decode(greedy(model, tokenizer(command[3])["input_ids"], 64))
    assert len(expected) >= 64 and done.stdout == expected + "\n"
    script = ROOT / command[1]
    assert os.access(script, os.X_OK)  # from any folder too: the engine is found beside the script, not in the cwd
    logged = subprocess.run([str(LLAMACPP), str(script), *command[2:], "--verbose"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=600)
    context = gguf_mark(gguf)["context"]
    assert logged.stdout == done.stdout and context == 1024
    assert f"n_ctx_slot = {context}," in logged.stderr  # YaRN x2 of 512, from the file


def test_the_command_exports_a_saved_folder_and_refuses_before_writing(tmp_path, capsys):
    from hf_posenc.cli import main
    from hf_posenc.folders import gguf_mark

    for name, scheme, options in (("yarn", "yarn", {"factor": 2.0}), ("xpos", "xpos", {})):
        hp.patch(peaky("llama"), scheme, **options).save_pretrained(tmp_path / name)
        byte_tokenizer().save_pretrained(tmp_path / name)
    assert main(["export", str(tmp_path / "yarn"), "--gguf", str(tmp_path / "yarn.gguf"), "--dtype", "q8_0"]) == 0
    mark = gguf_mark(tmp_path / "yarn.gguf")
    assert (mark["posenc"]["scheme"], mark["architecture"], mark["dtype"], mark["context"]) == ("yarn", "llama", "q8_0", 1024)
    assert main(["export", str(tmp_path / "xpos"), "--gguf", str(tmp_path / "xpos.gguf")]) == 2
    assert "scheme 'xpos'" in capsys.readouterr().err and not (tmp_path / "xpos.gguf").exists()


def dequantized(model: torch.nn.Module, path: Path) -> torch.nn.Module:
    """The model with the weights the GGUF holds (dequantised, q/k rows back in transformers' order)."""
    import copy

    from gguf import GGUFReader
    from gguf.quants import dequantize

    from hf_posenc.serving.gguf.export import gguf_name

    tensors = {t.name: t for t in GGUFReader(path).tensors}
    out = copy.deepcopy(model)
    with torch.no_grad():
        for name, param in out.named_parameters():
            tensor = tensors[gguf_name(name) if name != "lm_head.weight" else "token_embd.weight"]
            value = torch.tensor(dequantize(tensor.data, tensor.tensor_type).copy()).reshape(param.shape)
            if ".q_proj." in name or ".k_proj." in name:  # undo the permutation: its inverse swaps back
                heads = out.config.num_attention_heads if ".q_proj." in name else out.config.num_key_value_heads
                value = value.reshape(heads, value.shape[0] // heads // 2, 2, -1).swapaxes(1, 2).reshape(param.shape)
            param.copy_(value)
    return out


@needs_llamacpp
def test_llama_cpp_runs_the_f16_bf16_and_q8_0_files(tmp_path):
    """The other weight types load and run with the weights they hold: llama.cpp's log-probabilities against
    transformers with the same (dequantised) weights. Measured: 4.8e-2 (f16), 0.19 (bf16), 0.27 (q8_0), from ggml
    rounding the activations too (to f16, bf16, q8_0 blocks); against fp32 weights q8_0 is 1.27 on this peaky
    model, so the tolerance below still tells a file with the right weights from one without."""
    model, tokenizer = hp.patch(peaky("llama"), "yarn", factor=2.0), byte_tokenizer()
    cells = [{"gguf": str(export_gguf(model, tmp_path / f"{dtype}.gguf", dtype, tokenizer=tokenizer)),
              "prompt": prompt(), "new_tokens": 8, "n_ctx": 512, "top": 5} for dtype in ("f16", "bf16", "q8_0")]
    for cell, answer in zip(cells, run_llamacpp(tmp_path, cells)):
        assert "error" not in answer, (cell["gguf"], answer.get("error"))
        assert len(answer["tokens"]) == 8
        same = dequantized(model, Path(cell["gguf"]))
        gaps = [logprob_gap(m, prompt(), answer["tokens"], answer["top_logprobs"]) for m in (same, model)]
        print(f"{Path(cell['gguf']).name}: top-5 logprob gap {gaps[0]:.2e} to its own weights, {gaps[1]:.2e} to fp32")
        assert gaps[0] < 0.5 and gaps[0] <= gaps[1] + 1e-3, (cell["gguf"], gaps)
