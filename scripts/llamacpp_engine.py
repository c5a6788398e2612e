"""llama.cpp on a GGUF file, through xllamacpp's embedded server (its prebuilt CPU build, in .venv-llamacpp): loaded
with the settings under which hf-posenc's exports are checked against transformers, and asked for greedy completions.

Shared by scripts/llamacpp-generate (the documented way to run an export) and tests/llamacpp_worker.py (the engine
tests), so the command the docs show runs what the tests run. Needs xllamacpp only, nothing of hf-posenc: run it with
.venv-llamacpp/bin/python (`make llamacpp` builds that venv).
"""

from __future__ import annotations

import json
from typing import Any

import xllamacpp as x

BATCH = 2048  # prompt tokens per forward pass (llama.cpp's default); capped at the context


def load(gguf: str, n_ctx: int = 0, threads: int = 1, verbose: bool = True) -> x.Server:
    """An engine on `gguf`, one sequence at a time, f32 KV cache and flash attention off: the settings under which
    llama.cpp's numbers are comparable with transformers' in fp32 (tests/test_gguf.py).

    Args:
        gguf: the GGUF file.
        n_ctx: context in tokens; 0 takes the file's own (`<arch>.context_length`, which `hf-posenc export` sets to
            the context the positional scheme was set for).
        threads: CPU threads (the tests use one).
        verbose: llama.cpp's log on stderr.
    """
    params = x.CommonParams()
    params.model.path = gguf
    params.n_ctx = n_ctx
    params.n_batch = params.n_ubatch = min(n_ctx or BATCH, BATCH)
    params.n_parallel = 1
    params.cpuparams.n_threads = params.cpuparams_batch.n_threads = threads
    params.cache_type_k = params.cache_type_v = x.ggml_type.GGML_TYPE_F32
    params.flash_attn_type = x.llama_flash_attn_type.LLAMA_FLASH_ATTN_TYPE_DISABLED
    params.warmup = False
    if not verbose:
        params.verbosity = 0
    return x.Server(params)


def complete(server: x.Server, prompt: str | list[int], new_tokens: int, top: int = 0) -> dict[str, Any]:
    """llama.cpp's greedy continuation of `prompt` (text, or token ids): its completion choice, with `text` and, when
    `top` > 0, `logprobs` (the `top` most likely tokens at each step). A request llama.cpp refuses is a RuntimeError
    carrying its reply."""
    reply = server.handle_completions({"prompt": prompt, "n_predict": new_tokens, "temperature": 0, "n_probs": top,
                                       "cache_prompt": False})
    if "error" in reply or "code" in reply:
        raise RuntimeError(json.dumps(reply)[:2000])
    return reply["choices"][0]
