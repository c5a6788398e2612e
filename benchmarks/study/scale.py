"""The study's two scales: `cpu`, the first study (results.json), and `gpu` (issue 40, results_gpu.json): the
seeds' core arms on a wider model trained on at least 30x the CPU scale's tokens, so that added, concatenated
and rotated positions are compared where models actually learn (the CPU scale stops near perplexity 170).

The gpu scale's steps are sized at start-up from a measured training throughput: each run trains at least
`MIN_FACTOR` x 327,680 tokens, more when the budget allows all runs more. A rerun continues the runs its
results file lacks, with the settings that file holds (no new sizing), so a study cut at one call's budget
goes on in the next."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
from typing import Any, Iterator

import torch
import transformers

from settings import FULL, SMOKE, Settings

MIN_FACTOR = 30  # tokens per run, at least this many times the CPU scale's
# learned added, sinusoidal added, concat (d/8 of the same width: the best concat arm of the CPU scale), untied,
# rope, alibi, nope, p_rope: the seeds' add-vs-concat-vs-rotate question and the biases around it
GPU_ARMS = ("learned", "sinusoidal", "concat_d8", "untied", "rope", "alibi", "nope", "p_rope")
TINY_ARMS = ("learned", "rope")  # the dry run: one added arm (geometry traced) and one rotated
# of a run's time: the rest builds, scores and traces it (the CPU scale: 160 steps of ~0.73 s in ~2.5 minutes)
TRAIN_SHARE = 0.7
STEP_GRID = 50  # steps rounded up to a multiple of this


@dataclasses.dataclass(frozen=True)
class Scale:
    """Where a scale's results go and what it runs; `sized` says whether its steps come from a throughput."""

    name: str
    settings: Settings
    arms: tuple[str, ...] | None  # None: every arm of arms.py
    stem: str  # results file names: STEM.json, STEM.md
    plots: tuple[str, str]  # perplexity plot, geometry plot
    work: str  # scratch folder of the run folders
    sized: bool = False
    floor_tokens: int = 0  # tokens per run at least (gpu scale)
    cap_tokens: int | None = None  # and at most (the dry run's tiny scale)
    step_grid: int = STEP_GRID


CPU = Scale("cpu", FULL, None, "results", ("study.png", "geometry.png"), "work")
SMOKE_SCALE = Scale("cpu", SMOKE, ("learned", "rope"), "results", ("study.png", "geometry.png"), "work")  # --smoke
# 6 x 512 (vs 4 x 256), 256-token windows of 64 a step; steps are sized at start-up (`sized`), never from here
GPU_BASE = Settings(layers=6, width=512, heads=8, vocab=8192, seq_len=256, steps=STEP_GRID, batch_size=64, lr=1e-3,
                    seeds=(0, 1), checkpoints=4, windows=32, target=128, passkey_trials=8)
GPU = Scale("gpu", GPU_BASE, GPU_ARMS, "results_gpu", ("study_gpu.png", "geometry_gpu.png"), "work_gpu", sized=True,
            floor_tokens=MIN_FACTOR * FULL.tokens)
# the dry run: the gpu scale's pipeline (sizing, names, device handling) at the smoke size, 4 to 8 steps a run
TINY = Scale("gpu", SMOKE, TINY_ARMS, "results_gpu", ("study_gpu.png", "geometry_gpu.png"), "work_gpu", sized=True,
             floor_tokens=SMOKE.tokens, cap_tokens=2 * SMOKE.tokens, step_grid=2)


def scale(name: str, smoke: bool = False, tiny: bool = False) -> Scale:
    """The preset of `--scale name` (`--smoke` and `--tiny` are the two scales' pipeline checks)."""
    if name == "gpu":
        return TINY if tiny else GPU
    return SMOKE_SCALE if smoke else CPU


def sized(s: Settings, tokens_per_s: float, budget_s: float, runs: int, sc: Scale) -> Settings:
    """`s` with steps for `runs` runs to share `budget_s` at `tokens_per_s` (training's share of each run), within
    the scale's floor and cap of tokens per run; steps round up to a multiple of its grid and of checkpoints."""
    tokens = max(sc.floor_tokens, tokens_per_s * budget_s * TRAIN_SHARE / max(1, runs))
    tokens = min(tokens, sc.cap_tokens) if sc.cap_tokens else tokens
    grid = math.lcm(sc.step_grid, max(1, s.checkpoints))
    return dataclasses.replace(s, steps=grid * math.ceil(tokens / (s.batch_size * s.seq_len) / grid))


def device(name: str | None, sc: Scale) -> torch.device:
    """`--device`: auto takes CUDA where there is one; the default is the scale's (the CPU scale stays on the CPU,
    so its runs on a GPU machine remain comparable with those measured in fp32 on 2 cores)."""
    name = name or ("auto" if sc.name == "gpu" else "cpu")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here")
    return torch.device(name)


@contextlib.contextmanager
def training_on(where: torch.device) -> Iterator[None]:
    """The recipe runner's Accelerator trains on the accelerator it sees; on the CPU while this holds
    (`ACCELERATE_USE_CPU`, as hf_posenc.evaluation.processes reads it), restored after."""
    before = os.environ.get("ACCELERATE_USE_CPU")
    if where.type == "cpu" and torch.cuda.is_available():
        os.environ["ACCELERATE_USE_CPU"] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("ACCELERATE_USE_CPU", None)
        else:
            os.environ["ACCELERATE_USE_CPU"] = before


def autocast(where: torch.device) -> Any:
    """bf16 autocast on CUDA (training does the same through the recipe's mixed_precision); none on the CPU, where
    the CPU scale's numbers were measured in fp32."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if where.type == "cuda" else torch.autocast("cpu", enabled=False)


def tokens_per_second(s: Settings, where: torch.device, steps: int = 6) -> float:
    """Training tokens per second of the study's model (the learned arm, the widest but concat_wide) on `where`:
    forward, backward and an AdamW step on random tokens, after two warm-up steps."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=s.vocab, n_positions=s.seq_len, n_embd=s.width, n_layer=s.layers,
                                     n_head=s.heads)
    model = transformers.GPT2LMHeadModel(config).to(where).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=s.lr)
    ids = torch.randint(0, s.vocab, (s.batch_size, s.seq_len), device=where)

    def step() -> None:
        with autocast(where):
            loss = model(ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(2):
        step()
    if where.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    if where.type == "cuda":
        torch.cuda.synchronize()
    return steps * s.batch_size * s.seq_len / (time.perf_counter() - t0)
