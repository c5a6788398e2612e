"""Run GGUF files in llama.cpp (xllamacpp's embedded server) and write their greedy tokens and top logprobs.

Runs with .venv-llamacpp/bin/python (xllamacpp only; nothing of hf-posenc): `llamacpp_worker.py CELLS OUT`, where
CELLS is a JSON list of {"gguf", "prompt" (token ids) or "prompts" (a list of them, one model load), "new_tokens",
"n_ctx", "top"} and OUT gets one {"tokens", "top_logprobs"} (or {"runs": [...]} for "prompts"), or {"error"}, per
cell. f32 KV cache, flash attention off, one thread, temperature 0,
no EOS emitted by the test models: the settings under which llama.cpp's numbers are comparable with transformers' in fp32.
"""

from __future__ import annotations

import json
import sys

import xllamacpp as x


def run(cell: dict) -> dict:
    params = x.CommonParams()
    params.model.path = cell["gguf"]
    params.n_ctx = cell["n_ctx"]
    params.n_batch = params.n_ubatch = min(cell["n_ctx"], 2048)
    params.n_parallel = 1
    params.cpuparams.n_threads = params.cpuparams_batch.n_threads = 1
    params.cache_type_k = params.cache_type_v = x.ggml_type.GGML_TYPE_F32
    params.flash_attn_type = x.llama_flash_attn_type.LLAMA_FLASH_ATTN_TYPE_DISABLED
    params.warmup = False
    server = x.Server(params)
    runs = [complete(server, prompt, cell) for prompt in cell.get("prompts", [cell.get("prompt")])]
    del server
    errors = [r["error"] for r in runs if "error" in r]
    return {"error": errors[0]} if errors else {"runs": runs} if "prompts" in cell else runs[0]


def complete(server: x.Server, prompt: list[int], cell: dict) -> dict:
    reply = server.handle_completions({"prompt": prompt, "n_predict": cell["new_tokens"], "temperature": 0,
                                       "n_probs": cell.get("top", 5), "cache_prompt": False})
    if "error" in reply or "code" in reply:
        return {"error": json.dumps(reply)[:2000]}
    steps = reply["choices"][0]["logprobs"]["content"]  # one entry per token whose text is whole UTF-8
    return {"tokens": [s["id"] for s in steps],
            "top_logprobs": [{str(t["id"]): t["logprob"] for t in s["top_logprobs"]} for s in steps]}


def main() -> None:
    cells = json.loads(open(sys.argv[1]).read())
    out = []
    for cell in cells:
        try:
            out.append(run(cell))
        except Exception as err:  # a model llama.cpp refuses to load: reported per cell
            out.append({"error": f"{type(err).__name__}: {err}"})
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
