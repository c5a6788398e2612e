"""How often a q8_0 GGUF export generates the same greedy tokens as the f32 export, in llama.cpp (issue 48).

SmolLM2-135M-Instruct (from its package) patched with `yarn` x2 by hf-posenc, exported twice by `hp.export_gguf`
(f32, and q8_0: 2-D weights in 8-bit blocks of 32, norms f32), and run in llama.cpp (xllamacpp's CPU build, in
.venv-llamacpp: f32 KV cache, flash attention off, one thread, greedy). The prompts are `--prompts` windows of 128
tokens of the King James Bible (Genesis onwards, 997 tokens apart), each followed by 32 new tokens. Per prompt:
do the two exports agree on the first token, and on all 32? Both rates come with n and a 95% Wilson interval, along
with the mean length of the prefix the two exports share. The f32 export is checked against transformers + hf-posenc
on the same prompts.

    python benchmarks/gguf_quantised.py [--prompts 24] [--llamacpp-python .venv-llamacpp/bin/python]
Writes benchmarks/results/gguf_quantised.json and benchmarks/results/gguf_quantised.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

RESULTS = Path(__file__).parent / "results"
ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "tests" / "llamacpp_worker.py"
PROMPT_TOKENS, NEW_TOKENS, STRIDE = 128, 32, 997


def shared_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--llamacpp-python", default=str(ROOT / ".venv-llamacpp" / "bin" / "python"))
    args = parser.parse_args()

    import torch

    import hf_posenc as hp
    from hf_posenc import results
    from hf_posenc.data import long_text
    from hf_posenc.loading import load_model, load_tokenizer
    from hf_posenc.stats import rate_fields

    model, tokenizer = load_model("smollm2", task="saved", dtype=torch.float32), load_tokenizer("smollm2")
    hp.patch(model, "yarn", factor=2.0)
    ids = tokenizer(long_text("kjv")[: 6 * STRIDE * args.prompts])["input_ids"]
    prompts = [ids[i * STRIDE: i * STRIDE + PROMPT_TOKENS] for i in range(args.prompts)]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        files = {dtype: hp.export_gguf(model, Path(tmp) / f"{dtype}.gguf", dtype, tokenizer=tokenizer)
                 for dtype in ("f32", "q8_0")}
        sizes = {dtype: path.stat().st_size for dtype, path in files.items()}
        cells = [{"gguf": str(path), "prompts": prompts, "new_tokens": NEW_TOKENS, "n_ctx": 512, "top": 1}
                 for path in files.values()]
        (Path(tmp) / "cells.json").write_text(json.dumps(cells))
        subprocess.run([args.llamacpp_python, str(WORKER), str(Path(tmp) / "cells.json"), str(Path(tmp) / "out.json")],
                       check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        f32, q8 = ([run["tokens"] for run in cell["runs"]] for cell in json.loads((Path(tmp) / "out.json").read_text()))
    llamacpp_s = time.perf_counter() - start
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        reference = [model.generate(input_ids=torch.tensor([p]), max_new_tokens=NEW_TOKENS, do_sample=False,
                                    pad_token_id=0)[0, PROMPT_TOKENS:].tolist() for p in prompts]
    n = len(prompts)
    first = sum(a[:1] == b[:1] for a, b in zip(f32, q8))
    whole = sum(a == b for a, b in zip(f32, q8))
    f32_equal = sum(a == r[: len(a)] and len(a) == NEW_TOKENS for a, r in zip(f32, reference))
    record = {
        "model": "SmolLM2-135M-Instruct", "patch": "yarn factor=2", "prompts": n, "prompt_tokens": PROMPT_TOKENS,
        "new_tokens": NEW_TOKENS, "file_bytes": sizes,
        "q8_0_vs_f32_first_token": {"rate": first / n, **rate_fields(first, n)},
        "q8_0_vs_f32_all_tokens": {"rate": whole / n, **rate_fields(whole, n)},
        "q8_0_vs_f32_mean_shared_prefix": sum(shared_prefix(a, b) for a, b in zip(f32, q8)) / n,
        "f32_vs_transformers_all_tokens": {"rate": f32_equal / n, **rate_fields(f32_equal, n)},
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, one llama.cpp thread",
        "load_average_at_end": os.getloadavg()[0], "llamacpp_seconds": round(llamacpp_s, 1),
        "versions": results.versions(),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "gguf_quantised.json").write_text(json.dumps(record, indent=1) + "\n")

    def cell(rate: dict) -> str:
        return f"{rate['rate']:.2f} [{rate['low']:.2f}, {rate['high']:.2f}] (n={rate['n']})"

    (RESULTS / "gguf_quantised.md").write_text(
        f"SmolLM2-135M-Instruct patched with yarn x2, {n} prompts of {PROMPT_TOKENS} tokens, {NEW_TOKENS} greedy tokens "
        f"each, in llama.cpp (xllamacpp, {record['machine']}, load average "
        f"{record['load_average_at_end']:.1f} at the end; exports and both runs {llamacpp_s:.0f} s). Rates with "
        "their 95% Wilson interval.\n\n"
        "| comparison | rate [95% interval] |\n|---|---|\n"
        f"| q8_0 = f32, first token | {cell(record['q8_0_vs_f32_first_token'])} |\n"
        f"| q8_0 = f32, all {NEW_TOKENS} tokens | {cell(record['q8_0_vs_f32_all_tokens'])} |\n"
        f"| q8_0 and f32: mean shared prefix | {record['q8_0_vs_f32_mean_shared_prefix']:.1f} of {NEW_TOKENS} tokens |\n"
        f"| f32 export = transformers + hf-posenc, all {NEW_TOKENS} tokens | "
        f"{cell(record['f32_vs_transformers_all_tokens'])} |\n"
        f"| file size f32 / q8_0 | {sizes['f32'] / 2**20:.0f} MiB / {sizes['q8_0'] / 2**20:.0f} MiB |\n")
    print((RESULTS / "gguf_quantised.md").read_text())


if __name__ == "__main__":
    main()
