"""What each process runs in the multi-process tests: `python -m torch.distributed.run --nproc_per_node 2
tests/distributed_worker.py MODE ...` (gloo on CPU), or plain `python tests/distributed_worker.py MODE ...`
for the single-process reference. Rank 0 writes a JSON report; the tests compare the reports.

    split REPORT MODEL_DIR   evaluation.processes and the scoring functions split over the processes
    fsdp REPORT RECIPE...    the recipe's LoRA + scheme model, FSDP2 `fully_shard` per decoder layer,
                             3 optimizer steps, then saved through `modeling.save_model` (rank 0)
    distill REPORT RECIPE    the runner's distillation under accelerate's FSDP2 preparation (2 processes) or
                             plain (1): the teacher as the runner builds it, then `train` of the recipe
    refused REPORT RECIPE    the runner's PosEncError for the recipe under FSDP1 (one process)
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))


def _world() -> tuple[int, int]:
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group("gloo")
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def split(rank: int, world: int, report: Path, model_dir: str) -> dict:
    """Every helper of `evaluation.processes` on uneven splits, and the scorers with distributed=True."""
    from test_evaluation import char_tokenizer

    from hf_posenc import data, evaluation
    from hf_posenc.evaluation.processes import across_processes, main_process_first
    from hf_posenc.evaluation.scoring import greedy_answers
    from hf_posenc.loading import load

    out: dict = {"world": world}
    calls: list[list[int]] = []

    def double(items: list[int]) -> list[int]:
        calls.append(list(items))
        return [2 * i for i in items]

    for n in (0, 1, 5, 6):
        out[f"split{n}"] = across_processes(list(range(n)), double, distributed=True)
    out["calls"] = [calls] * world  # what each process scored, padded
    if world > 1:
        dist.all_gather_object(out["calls"], calls)

    marker = report.with_name("first.txt")
    with main_process_first(distributed=True):
        order = marker.read_text() if marker.exists() else ""
        marker.write_text(order + str(rank))
    if world > 1:
        dist.barrier()
    out["first"] = marker.read_text()

    torch.manual_seed(0)  # the same random t5 table in every process
    model, _ = load(model_dir, scheme="t5", options={"init_std": 0.5})
    ids = evaluation.text_token_ids(char_tokenizer(), data.long_text("kjv"), 800)
    out["perplexity"] = evaluation.perplexity_by_length(model, ids, [48, 100], stride=40, batch_size=2, mode="sliding",
                                                         max_windows=5, distributed=True)
    out["passkey"] = evaluation.passkey(model, char_tokenizer(), [400], depths=[0, 0.5, 1], trials=1, distributed=True)
    prompts = [f"{word} is the word number {i}:" for i, word in enumerate(["alpha", "be", "gamma", "delta", "eps"])]
    out["answers"] = greedy_answers(model, char_tokenizer(), prompts, [" xyzw"] * 5, extra=2, distributed=True)
    return out


def fsdp(rank: int, world: int, report: Path, recipes: list[str]) -> dict:
    """Train each recipe's model 3 steps, sharded per decoder layer when world > 1, and save it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.fsdp import fully_shard

    from hf_posenc.train import inputs, load_recipe, modeling, tasks

    out: dict = {"world": world}
    for path in recipes:
        recipe = load_recipe(path)
        t = recipe.training
        torch.manual_seed(t.seed)  # the same patch and LoRA initialisation on every process
        model, tokenizer = modeling.load_recipe_model(recipe)
        model = modeling.select_trainable(model, recipe, modeling.apply_posenc(model, recipe))
        model.train()
        if world > 1:
            layers = set(model.get_base_model()._no_split_modules)
            for module in list(model.modules()):
                if type(module).__name__ in layers:
                    fully_shard(module)
            fully_shard(model)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=t.learning_rate)
        stream = [t for row in tasks.prepare(recipe, inputs.load_raw(recipe), tokenizer).train["input_ids"] for t in row]
        rows = [{"input_ids": block} for block in torch.tensor(stream).view(-1, recipe.data.seq_len)]  # as TRL packs
        size = recipe.global_batch(world)
        share = size // world
        losses = []
        for step in range(3):
            batch = [rows[step * size + rank * share + i] for i in range(share)]
            ids = torch.stack([row["input_ids"] for row in batch])
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, t.max_grad_norm)  # a norm over all shards, or clipping differs
            optimizer.step()
            optimizer.zero_grad()
            total = loss.detach().clone()
            if world > 1:
                dist.all_reduce(total)  # FSDP averages gradients over processes: the loss is their mean
            losses.append(total.item() / world)
        model.eval()
        probe = torch.stack([rows[100 + i]["input_ids"] for i in range(2)])
        with torch.no_grad():
            logits = model(input_ids=probe).logits  # a collective forward under FSDP: every process runs it
        weights = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if rank == 0:
            modeling.save_model(model, tokenizer, recipe, Path(recipe.training.output_dir), weights, sharded=world > 1)
        out[recipe.posenc.scheme] = {"losses": losses, "probe": probe.tolist(), "logits": logits.tolist(),
                                     "sharded": sum(type(p).__name__ == "DTensor" for p in model.parameters())}
    return out


def fsdp_state(fsdp: bool, version: int = 2) -> Any:
    """An Accelerator whose state (one per process) is FSDP with TRANSFORMER_BASED_WRAP and ram-efficient
    loading, as accelerate_configs/fsdp.yaml sets, on CPU processes when `fsdp`.

    accelerate picks FSDP only on an accelerator; set before the runner builds its own Accelerator, which shares
    the state, its `prepare` then shards the student with `fsdp2_prepare_model` as on GPUs."""
    from accelerate import Accelerator, PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    accelerator = Accelerator(cpu=True)
    if fsdp:  # both shared states: a new Accelerator copies the partial one's over its own
        PartialState().distributed_type = accelerator.state.distributed_type = DistributedType.FSDP
        accelerator.state.fsdp_plugin = FullyShardedDataParallelPlugin(
            fsdp_version=version, auto_wrap_policy="transformer_based_wrap", cpu_ram_efficient_loading=version == 2,
            reshard_after_forward=True if version == 2 else "FULL_SHARD", state_dict_type="FULL_STATE_DICT")
    return accelerator


def refused(rank: int, world: int, report: Path, recipe_path: str) -> dict:
    """The runner's answer to the recipe under FSDP1 (forced on this process): its error, if any."""
    from hf_posenc.errors import PosEncError
    from hf_posenc.train import load_recipe, runner

    fsdp_state(True, version=1)
    try:
        runner.train(load_recipe(recipe_path))
    except PosEncError as err:
        return {"error": str(err)}
    return {"error": None}


def distill(rank: int, world: int, report: Path, recipe_path: str) -> dict:
    """The teacher the runner builds (sharded under FSDP2) against the unpatched model, then the run itself."""
    from torch.distributed.tensor import DTensor

    from hf_posenc.train import load_recipe, modeling, objectives, runner

    accelerator = fsdp_state(world > 1)
    recipe = load_recipe(recipe_path)
    torch.manual_seed(recipe.training.seed)
    model, _ = modeling.load_recipe_model(recipe)
    _, teacher = objectives.build(recipe, model, fsdp=world > 1)
    model = modeling.select_trainable(model, recipe, modeling.apply_posenc(model, recipe))
    teacher.freeze_trained()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    teacher.place(accelerator)
    probe = torch.randint(3, 120, (2, 24), generator=torch.Generator().manual_seed(rank))  # a different batch per rank
    unpatched, _ = modeling.load_recipe_model(recipe)
    with torch.no_grad():
        want = unpatched(input_ids=probe).logits
    got = teacher({"input_ids": probe}, hidden=True).logits  # collective: every process calls it
    params = list(teacher.model.parameters())
    mine = {"equal": torch.equal(got, want), "max_diff": (got - want).abs().max().item(),
            "full": sum(p.numel() for p in params),
            "local": sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in params),
            "dtensors": sum(isinstance(p, DTensor) for p in params), "params": len(params),
            "student_dtensors": sum(isinstance(p, DTensor) for p in model.parameters())}
    out: dict = {"world": world, "ranks": [mine] * world}
    if world > 1:
        dist.all_gather_object(out["ranks"], mine)
    runner.train(recipe)  # ends with accelerator.end_training(), which leaves the process group
    return out


if __name__ == "__main__":
    mode, report, *rest = sys.argv[1:]
    rank, world = _world()
    result = {"split": split, "fsdp": fsdp, "distill": distill, "refused": refused}[mode](rank, world, Path(report),
                                                                     *([rest] if mode == "fsdp" else rest))
    if rank == 0:
        Path(report).write_text(json.dumps(result))
    if world > 1 and dist.is_initialized():
        dist.barrier()  # gloo may abort a process that leaves while another still talks to it
        dist.destroy_process_group()
