"""Serves folders with vLLM, one engine after another, for tests/test_serving.py (run in a subprocess: vLLM's
engine core spawns processes, and VLLM_PLUGINS is read once per process).

    python serving_worker.py cells.json results.json

cells.json: {"prompts": [[ids]...], "max_tokens": n, "folders": [path, ...]}; results.json gets, per folder,
{"tokens": [[ids]...], "top5": [[{id: logprob}, ...] per step, per prompt]} or {"error": "Type: message"}
(the root cause of a failed engine start is printed to stderr by the engine core, which the test reads).
"""

from __future__ import annotations

import gc
import json
import os
import sys

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB: tiny models need little cache


def serve(folder: str, prompts: list[list[int]], max_tokens: int) -> dict:
    from vllm import LLM, SamplingParams

    try:
        llm = LLM(model=folder, dtype="float32", max_model_len=512, enforce_eager=True, skip_tokenizer_init=True,
                  trust_remote_code=True, seed=0)
    except Exception as err:  # the refusal under test: recorded, and the next folder is served
        return {"error": f"{type(err).__name__}: {err}"}
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, logprobs=5, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    result = {"tokens": [list(o.outputs[0].token_ids) for o in outputs],
              "top5": [[{str(t): lp.logprob for t, lp in step.items()} for step in o.outputs[0].logprobs]
                       for o in outputs]}
    del llm
    gc.collect()
    return result


def main() -> None:
    cells = json.loads(open(sys.argv[1]).read())
    results = {folder: serve(folder, cells["prompts"], cells["max_tokens"]) for folder in cells["folders"]}
    with open(sys.argv[2], "w") as out:
        json.dump(results, out)


if __name__ == "__main__":
    main()
