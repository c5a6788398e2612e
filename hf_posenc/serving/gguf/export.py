"""`export_gguf`: a (patched) Llama-family model as one GGUF file that llama.cpp runs with the same positions.

Every decision is made first (the target architecture from the config, the tokenizer, the dtype, the path), so a
refusal leaves nothing behind; the file is then written under a temporary name beside the target and renamed at
the end. An existing path is replaced only when it is a GGUF that hf-posenc wrote (its `hf_posenc.posenc` key).
Tensors and keys are named as llama.cpp's `convert_hf_to_gguf.py` names them for `LlamaForCausalLM`: q/k rows
permuted to the interleaved (NORM) rotary layout, tied embeddings written once, norms in f32.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...errors import PosEncError
from ...folders import GGUF_MARK, gguf_mark
from ...version import __version__
from .targets import FAMILIES, Target, facts_of, target_of
from .vocab import Vocab, read_vocab

__all__ = ["DTYPES", "export_gguf", "plan_gguf"]

# --dtype -> (GGML type of 2-D weights, llama.cpp file type)
DTYPES: dict[str, tuple[str, int]] = {"f32": ("F32", 0), "f16": ("F16", 1), "bf16": ("BF16", 32), "q8_0": ("Q8_0", 7)}
# transformers parameter (after `model.layers.N.`) -> llama.cpp tensor (after `blk.N.`)
LAYER_TENSORS: dict[str, str] = {
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight",
}
MODEL_TENSORS = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                 "lm_head.weight": "output.weight"}


def permute(weights: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows of each head from transformers' rotate-half order (i, i + d/2) to llama.cpp's interleaved pairs
    (2i, 2i + 1): `LlamaModel.permute` of the converter."""
    return weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:]).swapaxes(1, 2).reshape(weights.shape)


def gguf_name(name: str) -> str | None:
    if name in MODEL_TENSORS:
        return MODEL_TENSORS[name]
    parts = name.split(".", 3)
    if len(parts) == 4 and parts[:2] == ["model", "layers"] and parts[3] in LAYER_TENSORS:
        return f"blk.{parts[2]}.{LAYER_TENSORS[parts[3]]}"
    return None


def tensors(model: Any, config: Any, target: Target) -> dict[str, torch.Tensor]:
    """The model's weights under llama.cpp's names, q/k permuted where the family rotates in NORM layout."""
    family = FAMILIES[facts_of(config, type(model).__name__).stock]
    state = model.state_dict()
    if getattr(config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    unknown = [name for name in state if gguf_name(name) is None]
    if unknown:
        raise PosEncError(f"cannot export to GGUF: the model holds {', '.join(unknown[:3])}, which no llama.cpp "
                          f"{target.arch!r} tensor takes; nothing was written")
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads or config.num_attention_heads
    out = {}
    for name, value in state.items():
        value = value.detach().float().cpu()
        if family.permute and ".self_attn.q_proj." in name:
            value = permute(value, heads)
        elif family.permute and ".self_attn.k_proj." in name:
            value = permute(value, kv_heads)
        out[gguf_name(name)] = value
    if target.rope_freqs is not None:
        out["rope_freqs.weight"] = torch.tensor(target.rope_freqs, dtype=torch.float32)
    return out


def check_path(path: Path, overwrite: bool) -> None:
    """The output may be new, or (with `overwrite`) a GGUF hf-posenc wrote; anything else is never replaced."""
    if path.is_dir():
        raise PosEncError(f"{path} is a folder; give a new .gguf file name")
    if not path.parent.is_dir() or not os.access(path.parent, os.W_OK):
        raise PosEncError(f"{path}: {path.parent} is not a writable folder; choose another place")
    if path.exists():
        if gguf_mark(path) is None:
            raise PosEncError(f"{path} exists and hf-posenc did not write it (no {GGUF_MARK} key); delete it "
                              "yourself if you no longer need it, or choose a new name")
        if not overwrite:
            raise PosEncError(f"{path} exists (a GGUF hf-posenc wrote); pass overwrite=True (--overwrite) to "
                              "replace it, or choose a new name")


def plan_gguf(config: Any, tokenizer: Any, dtype: str, stock: str | None = None) -> tuple[Target, Vocab]:
    """Every check that reads no weights: the dtype, the architecture and scheme, the tokenizer."""
    if dtype not in DTYPES:
        raise PosEncError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    target = target_of(config, stock)
    if tokenizer is None:
        raise PosEncError("cannot export to GGUF without a tokenizer: llama.cpp reads its vocabulary from the file; "
                          "save the tokenizer in the folder, or pass tokenizer=")
    return target, read_vocab(tokenizer, config.vocab_size)


def write_keys(writer: Any, config: Any, target: Target, vocab: Vocab, dtype: str, name: str, head_dim: int) -> None:
    writer.add_type("model")
    writer.add_name(name)
    writer.add_string(GGUF_MARK, json.dumps({"version": __version__, "posenc": getattr(config, "posenc", None),
                                             "kept": target.kept, "architecture": target.arch, "dtype": dtype,
                                             "context": config.max_position_embeddings}, sort_keys=True))
    writer.add_vocab_size(config.vocab_size)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads or config.num_attention_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    if head_dim != config.hidden_size // config.num_attention_heads:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    for key, value in target.keys.items():
        full = f"{target.arch}.{key}"
        if isinstance(value, bool):
            writer.add_bool(full, value)
        elif isinstance(value, int):
            writer.add_uint32(full, value)
        elif isinstance(value, float):
            writer.add_float32(full, value)
        else:
            writer.add_string(full, value)
    writer.add_file_type(DTYPES[dtype][1])
    writer.add_quantization_version(2)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    writer.add_token_merges(vocab.merges)
    for special, token_id in vocab.special.items():
        getattr(writer, f"add_{special}_token_id")(token_id)
    writer.add_add_space_prefix(False)
    writer.add_add_bos_token(vocab.add_bos)
    if vocab.chat_template:
        writer.add_chat_template(vocab.chat_template)


def encode(value: torch.Tensor, name: str, dtype: str) -> tuple[np.ndarray, Any]:
    """(data, raw GGML type): 2-D weights in `dtype` (q8_0 where rows split into 32-blocks, as the converter),
    norms, biases and rope_freqs in f32."""
    from gguf import GGMLQuantizationType, quants

    data = value.numpy().astype(np.float32)
    wanted = GGMLQuantizationType[DTYPES[dtype][0]]
    if data.ndim < 2 or name == "rope_freqs.weight" or wanted == GGMLQuantizationType.F32:
        return data, GGMLQuantizationType.F32
    if wanted == GGMLQuantizationType.Q8_0 and data.shape[-1] % 32:
        wanted = GGMLQuantizationType.F16
    if wanted == GGMLQuantizationType.F16:
        return data.astype(np.float16), wanted
    return quants.quantize(data, wanted), wanted


def export_gguf(model_or_folder: Any, path: str | os.PathLike, dtype: str = "f32", *, tokenizer: Any = None,
                overwrite: bool = False) -> Path:
    """Write a (patched) model as a GGUF that llama.cpp runs with the same positions, or refuse by name.

    Args:
        model_or_folder: a transformers model (patched or not), a folder hf-posenc / save_pretrained wrote, or a
            packaged model's name ("smollm2").
        path: the .gguf file to write (new; with `overwrite`, one hf-posenc wrote before).
        dtype: f32, f16, bf16 or q8_0 for the 2-D weights (norms stay f32).
        tokenizer: the model's tokenizer (default: the folder's own).
        overwrite: replace `path` if hf-posenc wrote it.
    """
    try:
        from gguf import GGUFWriter
    except ImportError:
        raise PosEncError("GGUF export needs the gguf package: pip install 'hf-posenc[gguf]'") from None
    path = Path(path)
    if isinstance(model_or_folder, (str, os.PathLike)):
        from ...loading import load_config, load_model, load_tokenizer

        name = str(model_or_folder)
        config = load_config(name)
        target, vocab = plan_gguf(config, tokenizer if tokenizer is not None else load_tokenizer(name), dtype)
        check_path(path, overwrite)
        model = load_model(name, task="saved", dtype=torch.float32)
    else:
        model, config = model_or_folder, model_or_folder.config
        target, vocab = plan_gguf(config, tokenizer, dtype, type(model).__name__)
        check_path(path, overwrite)
        name = getattr(config, "name_or_path", "") or target.arch
    weights = tensors(model, config, target)
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    try:
        writer = GGUFWriter(tmp, target.arch)
        write_keys(writer, config, target, vocab, dtype, Path(str(name)).name or target.arch,
                   facts_of(config, type(model).__name__).head_dim)
        for tensor_name, value in weights.items():
            data, raw = encode(value, tensor_name, dtype)
            writer.add_tensor(tensor_name, data, raw_dtype=raw)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
