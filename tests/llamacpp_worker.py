"""Run GGUF files in llama.cpp (scripts/llamacpp_engine.py: xllamacpp's embedded server) and write their greedy tokens
and top logprobs.

Runs with .venv-llamacpp/bin/python (xllamacpp only; nothing of hf-posenc): `llamacpp_worker.py CELLS OUT`, where
CELLS is a JSON list of {"gguf", "prompt" (token ids) or "prompts" (a list of them, one model load), "new_tokens",
"n_ctx", "top"} and OUT gets one {"tokens", "top_logprobs"} (or {"runs": [...]} for "prompts"), or {"error"}, per
cell. The engine's settings (f32 KV cache, flash attention off, one thread, temperature 0) and no EOS emitted by the
test models: the conditions under which llama.cpp's numbers are comparable with transformers' in fp32.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))  # the engine the documented command runs

import llamacpp_engine as engine  # noqa: E402


def run(cell: dict) -> dict:
    server = engine.load(cell["gguf"], cell["n_ctx"])
    runs = [steps(engine.complete(server, prompt, cell["new_tokens"], cell.get("top", 5)))
            for prompt in cell.get("prompts", [cell.get("prompt")])]
    return {"runs": runs} if "prompts" in cell else runs[0]


def steps(choice: dict) -> dict:
    content = choice["logprobs"]["content"]  # one entry per token whose text is whole UTF-8
    return {"tokens": [s["id"] for s in content],
            "top_logprobs": [{str(t["id"]): t["logprob"] for t in s["top_logprobs"]} for s in content]}


def main() -> None:
    cells = json.loads(open(sys.argv[1]).read())
    out = []
    for cell in cells:
        try:
            out.append(run(cell))
        except Exception as err:  # a model llama.cpp refuses to load, or a request it refuses: reported per cell
            out.append({"error": f"{type(err).__name__}: {err}"})
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
