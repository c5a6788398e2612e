"""Recovery after a swap (issue 21): PoSE position ids, distillation from the model before the swap, the
recovery curve (`evaluation.every_steps`). Real models, real runs; the multi-process and resume tests are slow."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch
from conftest import DeviceWithoutFloat64, tiny_model
from test_train import REPO, recipe_dict, run_cli, tiny_assets, write_recipe

import hf_posenc as hp
from hf_posenc import results
from hf_posenc.errors import PosEncError
from hf_posenc.train import curve, inputs, load_recipe, modeling
from hf_posenc.train.objectives import Objective, Teacher
from hf_posenc.train.pose import PoseCollator, pose_position_ids
from hf_posenc.train.recipe import DistillArguments, PoseArguments


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return tiny_assets(tmp_path_factory.mktemp("tiny"))


# --- PoSE position ids ---

def _runs(ids: torch.Tensor) -> list[torch.Tensor]:
    """Split ids into maximal runs of +1 steps."""
    breaks = (ids.diff() != 1).nonzero().flatten() + 1
    return list(torch.tensor_split(ids, breaks.tolist()))


@pytest.mark.parametrize("length, target, chunks", [(16, 64, 2), (32, 512, 4), (128, 129, 3), (5, 40, 5), (8, 100, 1)])
def test_pose_ids_chunks_skips_and_seed(length, target, chunks):
    seen_skip = False
    for seed in range(20):
        ids = pose_position_ids(length, target, chunks, torch.Generator().manual_seed(seed))
        assert ids.shape == (length,) and ids.dtype == torch.long
        assert ids[0] == 0 and ids.max() < target  # first chunk from 0, every id inside the target length
        assert (ids.diff() >= 1).all()  # increasing: a skip is never backwards
        runs = _runs(ids)
        assert len(runs) <= chunks  # contiguous inside a chunk (two chunks may touch when a skip is 0)
        seen_skip |= len(runs) > 1
        again = pose_position_ids(length, target, chunks, torch.Generator().manual_seed(seed))
        assert torch.equal(ids, again)  # reproducible per seed
    assert seen_skip == (chunks > 1)
    draws = {tuple(pose_position_ids(length, target, chunks, torch.Generator().manual_seed(s)).tolist()) for s in range(20)}
    assert len(draws) > (1 if chunks > 1 and target - length > 1 else 0)  # drawn per example, not fixed


def test_pose_skips_cover_the_target_length():
    """Over many draws the last id reaches close to the target length (the paper: all distances are seen)."""
    last = [int(pose_position_ids(32, 512, 2, torch.Generator().manual_seed(s))[-1]) for s in range(200)]
    assert max(last) >= 480 and min(last) < 100 and max(last) <= 511


def _by_hand(model, tokens: torch.Tensor, ids: torch.Tensor, target: int) -> torch.Tensor:
    """The tokens placed at their position ids in a target-long row, the gaps filled with another token and
    masked out, run with positions 0..target-1 (given: a mask with holes must not renumber them): logits at
    the tokens' places."""
    row = torch.full((1, target), 7, dtype=torch.long)
    mask = torch.zeros(1, target, dtype=torch.long)
    row[0, ids], mask[0, ids] = tokens, 1
    with torch.no_grad():
        return model(input_ids=row, attention_mask=mask, position_ids=torch.arange(target)[None]).logits[0, ids]


# every site kind: input (sinusoidal, learned), q/k (rope, yarn), score (alibi, t5), attention (xpos, self_extend)
SITES = [("gpt2", "sinusoidal", {}), ("gpt2", "learned", {}), ("gpt2", "rope", {}), ("llama", "yarn", {"factor": 2.0}),
         ("llama", "alibi", {}), ("gpt2", "t5", {}), ("llama", "xpos", {}), ("llama", "self_extend", {"window": 8, "group": 2}),
         ("llama", None, {})]


@pytest.mark.parametrize("model_type, scheme, options", SITES, ids=[f"{m}-{s}" for m, s, _ in SITES])
def test_pose_batch_equals_tokens_placed_at_their_ids(model_type, scheme, options):
    model = tiny_model(model_type)
    if scheme:
        hp.patch(model, scheme, **options)
    target = 48  # below the tiny models' 64-position tables
    tokens = torch.randint(3, 120, (3, 16), generator=torch.Generator().manual_seed(1))
    batch = PoseCollator(target, 3, seed=5, eos_id=None)([{"input_ids": t.tolist()} for t in tokens])
    assert batch["attention_mask"].shape == (3, 16) and batch["position_ids"].shape == (3, 16)
    assert any(len(_runs(ids)) > 1 for ids in batch["position_ids"])  # real skips in the batch
    with torch.no_grad():
        logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
    for i in range(3):
        torch.testing.assert_close(logits[i], _by_hand(model, tokens[i], batch["position_ids"][i], target),
                                   atol=2e-4, rtol=2e-4)


def test_pose_packed_rows_keep_document_boundaries():
    model = hp.patch(tiny_model("llama"), "alibi")
    eos = 0
    doc1, doc2 = torch.randint(3, 120, (6,)), torch.randint(3, 120, (10,))
    row = torch.cat([doc1, torch.tensor([eos]), doc2])
    batch = PoseCollator(48, 2, seed=3, eos_id=eos)([{"input_ids": row.tolist()}, {"input_ids": [5] * 17}])
    ids = batch["position_ids"][0]
    assert ids[0] == 0 and ids[7] == 0  # each document's ids start from 0
    assert batch["attention_mask"].shape == (2, 1, 17, 17)  # a one-document row joins as a 4-D causal mask
    with torch.no_grad():
        packed = model(input_ids=batch["input_ids"][:1], position_ids=ids[None],
                       attention_mask=batch["attention_mask"][:1]).logits[0]
        alone = model(input_ids=doc2[None], position_ids=ids[None, 7:],
                      attention_mask=torch.ones(1, 10, dtype=torch.long)).logits[0]
    torch.testing.assert_close(packed[7:], alone, atol=1e-4, rtol=1e-4)  # nothing of doc1 leaks into doc2


def test_pose_masks_of_a_bf16_model_are_in_its_dtype(assets, tmp_path):
    """CUDA's memory-efficient sdpa takes no float mask of another dtype than q (bf16 weights, no autocast): the
    recipe's PoSE rows carry block-causal masks in the model's dtype, masked with that dtype's min."""
    recipe = _recipe(assets, tmp_path, dtype="bfloat16", pose={"target_length": 48, "chunks": 2})
    model, tokenizer = modeling.load_recipe_model(recipe)
    data = inputs.prepare_lm(recipe, inputs.load_raw(recipe), tokenizer)
    blocks = torch.tensor(data.train[0]["input_ids"]).view(-1, 32)  # the stream as TRL's "wrapped" packing cuts it
    item = next({"input_ids": b, **data.collate.row(b)} for b in blocks if data.collate.row(b)["attention_mask"].ndim == 3)
    mask, ids = item["attention_mask"], item["position_ids"]
    assert model.dtype == mask.dtype == torch.bfloat16 and mask.min() == torch.finfo(torch.bfloat16).min
    one_document = {"input_ids": [5] * 32}  # no EOS: a 2-D mask alone, 4-D beside a row of several documents
    assert data.collate([{"input_ids": item["input_ids"].tolist()}, one_document])["attention_mask"].dtype == torch.bfloat16
    last = int((ids == 0).nonzero().max())  # where the row's last document starts
    with torch.no_grad():
        def logits(mask: torch.Tensor) -> torch.Tensor:
            return model(input_ids=item["input_ids"][None], position_ids=ids[None], attention_mask=mask[None]).logits[0]

        alone = model(input_ids=item["input_ids"][None, last:], position_ids=ids[None, last:],
                      attention_mask=torch.ones_like(ids[None, last:])).logits[0]
        packed, leaking = logits(mask)[last:], logits(torch.ones_like(ids))[last:]
    # the unmasked-equivalent reference, to bf16 rounding; the earlier documents leaking in would move it by more
    bound = 0.02 * float(alone.abs().max())
    assert float((packed - alone).abs().max()) <= bound < float((leaking - alone).abs().max())


# --- distillation ---

def _recipe(assets, tmp_path, **fields):
    return load_recipe(write_recipe(tmp_path / "r.yaml", recipe_dict(assets, tmp_path / "out", **fields)))


def _student_and_teacher(recipe, model, share=True):
    teacher = Teacher(model, share)
    names = modeling.apply_posenc(model, recipe)
    student = modeling.select_trainable(model, recipe, names)
    teacher.freeze_trained()
    return student, teacher


@pytest.mark.parametrize("hidden_weight", [0.0, 0.3])
@pytest.mark.parametrize("objective", ["distill", "lm+distill"])
def test_distill_loss_equals_kl_by_hand(assets, tmp_path, objective, hidden_weight):
    options = {"temperature": 2.0, "weight": 0.7, "hidden_weight": hidden_weight}
    recipe = _recipe(assets, tmp_path, objective=objective, distill=options)
    original = tiny_model("llama")
    student, teacher = _student_and_teacher(recipe, copy.deepcopy(original))
    batch = {"input_ids": torch.randint(3, 120, (2, 12)), "labels": None}
    batch["labels"] = batch["input_ids"]
    loss = Objective(recipe, teacher)(student, batch)

    with torch.no_grad():
        s = student(input_ids=batch["input_ids"], labels=batch["labels"], output_hidden_states=True)
        t = original(input_ids=batch["input_ids"], output_hidden_states=True)
    T, total = 2.0, 0.0
    for b in range(2):
        for i in range(12):  # KL(p_t || p_s) at temperature T, position by position
            p_t, p_s = torch.softmax(t.logits[b, i] / T, -1), torch.softmax(s.logits[b, i] / T, -1)
            total += float((p_t * (p_t.log() - p_s.log())).sum())
    expected = 0.7 * T**2 * total / 24
    if hidden_weight:
        layers = [float(((a - b) ** 2).mean()) for a, b in zip(s.hidden_states[1:], t.hidden_states[1:])]
        expected += hidden_weight * sum(layers) / len(layers)
    if objective == "lm+distill":
        expected += float(s.loss)
    assert float(loss) == pytest.approx(expected, rel=1e-4)
    assert loss.requires_grad


def test_the_curve_clock_hands_the_device_no_float64():
    """MPS has no float64: the CPU seconds go to the processes' sum as fp32, whatever device `reduce` uses."""
    with DeviceWithoutFloat64() as device:
        wall, cpu = curve.Clock(3.0, 4.0).totals(lambda x: x.to("meta").cpu())
    assert device.created == [] and wall >= 3.0 and cpu == 4.0  # the stand-in device's sum: zeros


@pytest.fixture
def bf16_accelerator():
    """An Accelerator with bf16 mixed precision on CPU (torch autocasts CPU to bf16), its shared state reset before
    (an earlier test's Accelerator would keep its own precision) and after."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    yield Accelerator(cpu=True, mixed_precision="bf16")
    AcceleratorState._reset_state(reset_partial_state=True)


def _autocast_seen(model: torch.nn.Module) -> list[bool]:
    """Whether each forward of `model` from now on runs under CPU autocast (seen from its output head: accelerate
    wraps the top forward itself, whose own hooks run outside it)."""
    seen: list[bool] = []
    model.get_output_embeddings().register_forward_hook(lambda module, args, out: seen.append(torch.is_autocast_enabled("cpu")))
    return seen


def test_teacher_and_original_evaluation_run_under_the_students_autocast(assets, tmp_path, bf16_accelerator):
    """A bf16 student beside an fp32 teacher or baseline is another model on A100/H100: the teacher's forward and
    Trainer's evaluation of the model before the swap (never prepared) run under the same autocast as the student's."""
    from trl import SFTConfig

    from hf_posenc.train import tasks
    from hf_posenc.train.trainer import PosEncSFTTrainer

    recipe = _recipe(assets, tmp_path, objective="distill")
    student, teacher = _student_and_teacher(recipe, tiny_model("llama"))
    student = bf16_accelerator.prepare(student)
    teacher.place(bf16_accelerator)
    taught, teaching = _autocast_seen(student), _autocast_seen(teacher.model)
    ids = torch.randint(3, 120, (2, 12))
    Objective(recipe, teacher)(student, {"input_ids": ids, "labels": ids})
    assert taught == [True] and teaching == [True]

    original, tokenizer = modeling.load_recipe_model(recipe)  # never prepared, as in the runner
    evaluated = _autocast_seen(original)
    data = inputs.prepare_lm(recipe, inputs.load_raw(recipe), tokenizer)
    task = tasks.TRAINING_TASKS["causal_lm"]
    args = SFTConfig(output_dir=str(tmp_path / "t"), bf16=True, use_cpu=True, report_to="none",
                     per_device_eval_batch_size=4, remove_unused_columns=False, label_names=["labels"],
                     disable_tqdm=True, accelerator_config={"use_configured_state": True}, packing=True,
                     packing_strategy="wrapped", max_length=recipe.data.seq_len, gradient_checkpointing=False)
    trainer = PosEncSFTTrainer(model=student, args=args, train_dataset=data.train, eval_dataset=data.eval,
                               processing_class=tokenizer, objective=Objective(recipe, teacher), scores=task.scores,
                               tables=lambda model, scores: task.tables(model, scores, recipe, data, tokenizer),
                               held_out_loss=lambda tables: task.held_out_loss(recipe, tables))
    trainer.accelerator.prepare_model(student, evaluation_mode=True)  # as training prepared it before the reference
    tables = trainer.evaluate_other(original, "the original model", "eval_original")
    assert evaluated and all(evaluated)  # the held-out batches and the perplexity suite alike
    assert tables["perplexity"][str(recipe.data.seq_len)]["windows"] == len(trainer.eval_dataset) == 8


@pytest.mark.parametrize("model_type, scheme", [("llama", "alibi"), ("gpt2", "rope"), ("llama", "nope"), ("gpt2", "t5")])
def test_teacher_logits_are_the_unpatched_models_bit_for_bit(assets, tmp_path, model_type, scheme):
    recipe = _recipe(assets, tmp_path, scheme=scheme, trainable=["posenc", "norms"], objective="distill")
    student, teacher = _student_and_teacher(recipe, tiny_model(model_type))
    optimizer = torch.optim.AdamW([p for p in student.parameters() if p.requires_grad], lr=0.05)
    ids = torch.randint(3, 120, (2, 20))
    for _ in range(2):  # the student's norms, LoRA and positional parameters move; the teacher must not
        student(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    with torch.no_grad():
        got = teacher({"input_ids": ids}, hidden=False).logits
        want = tiny_model(model_type)(input_ids=ids).logits
        moved = student(input_ids=ids).logits
    assert torch.equal(got, want)
    assert (moved - want).abs().max() > 0.1  # the student is patched and trained: a different model


# under LoRA the groups trained in full are peft's `modules_to_save` copies: the originals the teacher shares stay frozen
@pytest.mark.parametrize("peft, cloned", [({"use_peft": True, "trainable": []}, "none"),
                                          ({"use_peft": True, "trainable": ["posenc", "norms"]}, "none"),
                                          ({"use_peft": False}, "all")])
def test_teacher_shares_weights_unless_the_student_trains_them(assets, tmp_path, peft, cloned):
    recipe = _recipe(assets, tmp_path, **peft, objective="distill")
    student, teacher = _student_and_teacher(recipe, tiny_model("llama"))
    storage = {p.untyped_storage().data_ptr() for p in student.parameters()}
    own = [(n, p) for n, p in teacher.model.named_parameters() if p.untyped_storage().data_ptr() not in storage]
    if cloned == "none":
        assert own == [] and teacher.frozen_bytes == 0  # no second copy of any weight
        copies = [n for n, p in student.named_parameters() if p.requires_grad and "modules_to_save" in n]
        assert bool(copies) == bool(peft["trainable"]) and all("norm" in n for n in copies)
    else:
        assert len(own) == len(list(teacher.model.parameters()))  # full fine-tuning: one frozen copy
    assert not any(p.requires_grad for _, p in own)


@pytest.mark.parametrize("peft", [{"use_peft": True, "trainable": []}, {"use_peft": False}])
def test_an_fsdp_teacher_is_its_own_frozen_copy(assets, tmp_path, peft):
    """Under FSDP2 the teacher shares nothing (the student's tensors become shards): one frozen copy, counted."""
    recipe = _recipe(assets, tmp_path, **peft, objective="distill")
    original = tiny_model("llama")
    student, teacher = _student_and_teacher(recipe, copy.deepcopy(original), share=False)
    storage = {p.untyped_storage().data_ptr() for p in student.parameters()}
    params = list(teacher.model.parameters())
    assert not any(p.untyped_storage().data_ptr() in storage or p.requires_grad for p in params)
    assert teacher.frozen_bytes == sum(p.numel() * 4 for p in params) == sum(p.numel() * 4 for p in original.parameters())
    ids = torch.randint(3, 120, (2, 20))
    with torch.no_grad():
        assert torch.equal(teacher({"input_ids": ids}, hidden=False).logits, original(input_ids=ids).logits)


# --- recipe fields ---

def test_new_fields_from_the_command_line(tmp_path, assets):
    path = write_recipe(tmp_path / "r.yaml", recipe_dict(assets, tmp_path / "out"))
    recipe = load_recipe(path, ["--pose", "{target_length: 64, chunks: 3}", "--objective", "lm+distill",
                                "--distill", "{temperature: 2}", "--eval_every_steps", "5"])
    assert recipe.posenc.pose == PoseArguments(64, 3) and recipe.posenc.eval_every_steps == 5
    assert recipe.posenc.distill == DistillArguments(2.0, 1.0, 0.0)
    assert recipe.to_dict()["pose"] == {"target_length": 64, "chunks": 3}  # as run.json holds it


def test_pose_and_distill_are_typed_and_refused_by_key(tmp_path, assets):
    """`pose` and `distill` are read into PoseArguments / DistillArguments; a mistake names the file and the key."""
    for fields, pieces in [
        ({"pose": {"target_lenght": 64}}, ["pose:", "'target_lenght'", "did you mean 'target_length'", "chunks (int"]),
        ({"pose": {"chunks": 3}}, ["pose.target_length:", "required"]),
        ({"pose": {"target_length": 64, "chunks": "three"}}, ["pose.chunks:", "expected a finite int", "'three'"]),
        ({"objective": "distill", "distill": {"temperature": math.nan}}, ["distill.temperature:", "finite float"]),
        ({"objective": "distill", "distill": {"weight": -1}}, ["distill.weight:", "must be >= 0", "got -1.0"]),
        ({"pose": {"target_length": 64, "chunks": 0}}, ["pose.chunks:", "1..seq_len=32", "got 0"]),
        ({"pose": 512}, ["pose: expected mapping or str or null, got 512"]),  # no class name of ours
    ]:
        path = write_recipe(tmp_path / "bad.yaml", recipe_dict(assets, tmp_path / "out", **fields))
        with pytest.raises(PosEncError) as err:
            load_recipe(path)
        assert str(path) in str(err.value) and all(piece in str(err.value) for piece in pieces), str(err.value)
    valid = {"pose": {"target_length": 64, "chunks": 3}, "objective": "distill", "distill": {"temperature": 2}}
    recipe = load_recipe(write_recipe(tmp_path / "ok.yaml", recipe_dict(assets, tmp_path / "out", **valid)))
    assert (recipe.posenc.pose, recipe.posenc.distill) == (PoseArguments(64, 3), DistillArguments(2.0, 1.0, 0.0))


# --- a real run: PoSE + distillation + the curve ---

def test_run_writes_the_recovery_curve(tmp_path, assets):
    out = tmp_path / "run"
    path = write_recipe(tmp_path / "r.yaml", recipe_dict(
        assets, out, pose={"target_length": 128, "chunks": 2}, objective="lm+distill", distill={"hidden_weight": 0.1},
        eval_every_steps=2, perplexity_lengths=[64], eval_max_windows=2, plot=True, save_model=False))
    proc = run_cli([str(path)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "distillation teacher" in proc.stdout and "MiB cloned" in proc.stdout
    record = results.load(out / "results.json")
    curve = record.details["curve"]
    assert [row["step"] for row in curve] == [0, 2, 4, 6]
    assert [row["tokens"] for row in curve] == [0, 256, 512, 768]  # 4 x 32 tokens a step
    assert all(b["cpu_s"] > a["cpu_s"] >= 0 and b["wall_s"] > a["wall_s"] for a, b in zip(curve, curve[1:]))
    for row in curve:
        assert set(row["perplexity"]) == {"32", "64"} and row["perplexity"]["32"] == pytest.approx(math.exp(row["loss"]))
    before = record.run("before training").metrics["perplexity"]["32"]["loss"]
    after = record.run("after training").metrics["perplexity"]["32"]["loss"]
    assert curve[0]["loss"] == before and curve[-1]["loss"] == pytest.approx(after, rel=1e-6)
    assert curve[-1]["loss"] < curve[0]["loss"]
    assert (out / "curve.png").stat().st_size > 10_000 and (out / "loss.png").stat().st_size > 0
    run = json.loads((out / "run.json").read_text())
    assert run["teacher_frozen_bytes"] == 0  # norms trained in full are peft's copies: the teacher shares the originals


# --- under accelerate DDP and after a kill (slow: real processes) ---

@pytest.mark.slow
def test_distill_two_processes_match_one(tmp_path, assets):
    from test_train_distributed import train_in_one_and_two_processes

    common = {"max_steps": 4, "global_batch_size": 4, "per_device_train_batch_size": 1, "objective": "lm+distill",
              "distill": {"temperature": 2.0, "hidden_weight": 0.1}, "pose": {"target_length": 96, "chunks": 2},
              "eval_every_steps": 2, "eval_original": False, "save_model": False}
    train_in_one_and_two_processes(tmp_path, assets, common)
    assert results.load(tmp_path / "two" / "results.json").details["world_size"] == 2
    assert_same_losses_and_curve(tmp_path)


@pytest.mark.slow
def test_distill_under_fsdp2_two_processes_match_one(tmp_path, assets):
    """accelerate's own FSDP2 preparation on 2 CPU processes (`distributed_worker.fsdp_state`): the student and
    its teacher sharded per decoder layer; one process's losses, curve and score of the model before the swap, the
    unpatched model's logits."""
    from test_eval_distributed import torchrun

    sections = {"max_steps": 4, "global_batch_size": 4, "per_device_train_batch_size": 1, "objective": "lm+distill",
                "distill": {"temperature": 2.0, "hidden_weight": 0.1}, "pose": {"target_length": 96, "chunks": 2},
                "trainable": ["posenc", "norms"], "eval_every_steps": 2, "eval_original": True, "save_model": False}
    one = write_recipe(tmp_path / "one.yaml", recipe_dict(assets, tmp_path / "one", **sections))
    two = write_recipe(tmp_path / "two.yaml", recipe_dict(assets, tmp_path / "two", **sections))
    proc = run_cli([str(one)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = torchrun(["distill", str(tmp_path / "report.json"), str(two)], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "its own frozen copy sharded like the student" in proc.stdout

    run = json.loads((tmp_path / "two" / "run.json").read_text())
    assert run["distributed_type"] == "DistributedType.FSDP" and run["world_size"] == 2
    ranks = json.loads((tmp_path / "report.json").read_text())["ranks"]
    full = ranks[0]["full"]
    assert run["teacher_frozen_bytes"] == 4 * full  # fp32: one frozen copy of the whole model, sharded
    for rank in ranks:  # each rank scored its own batch
        assert rank["equal"], rank["max_diff"]  # the teacher's logits are the unpatched model's, bit for bit
        assert rank["dtensors"] == rank["params"] and rank["student_dtensors"] > 0  # still shards after its forward
        assert 0.4 * full < rank["local"] < 0.6 * full
    assert sum(rank["local"] for rank in ranks) == full
    # the model before the swap, which shares the student's tensors, is scored once the student is sharded
    original1, original2 = (results.load(tmp_path / run / "results.json").run("original").metrics["perplexity"]["32"]
                            for run in ("one", "two"))
    assert original2["loss"] == pytest.approx(original1["loss"], rel=1e-5) and original2["windows"] == 8

    assert_same_losses_and_curve(tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["distill", "lm+distill"])
def test_fsdp1_refuses_distillation_by_name(tmp_path, assets, objective):
    """FSDP1 (forced on one CPU process) cannot shard the teacher like the student: a named error before any load."""
    import subprocess
    import sys

    from test_eval_distributed import ENV, TESTS

    path = write_recipe(tmp_path / "r.yaml", recipe_dict(assets, tmp_path / "out", objective=objective))
    proc = subprocess.run([sys.executable, str(TESTS / "distributed_worker.py"), "refused", str(tmp_path / "report.json"),
                           str(path)], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    error = json.loads((tmp_path / "report.json").read_text())["error"]
    assert error.startswith(f"{path}: objective: '{objective}' needs FSDP2") and "fsdp_version: 2" in error
    assert not (tmp_path / "out").exists()  # nothing written


@pytest.mark.slow
def test_distill_resume_after_a_kill_continues_the_same_curve(tmp_path, assets):
    from test_train_distributed import _kill_after_checkpoint

    sections = {"max_steps": 8, "save_strategy": "steps", "save_steps": 2, "full_determinism": True,
                "objective": "distill", "pose": {"target_length": 96, "chunks": 3}, "eval_every_steps": 2,
                "trainable": ["posenc", "norms"], "save_model": False}
    full = write_recipe(tmp_path / "full.yaml", recipe_dict(assets, tmp_path / "full", **sections))
    cut = write_recipe(tmp_path / "cut.yaml", recipe_dict(assets, tmp_path / "cut", **sections))
    proc = run_cli([str(full)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    _kill_after_checkpoint([str(cut)], tmp_path / "cut", step=4)
    proc = run_cli([str(cut), "--resume"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((tmp_path / "cut" / "run.json").read_text())["resumed_from"]
    la, lb = ([r["loss"] for r in json.loads((tmp_path / run / "loss.json").read_text())] for run in ("full", "cut"))
    assert la == lb  # bit for bit: the teacher after a resume is the model before the swap again
    ca, cb = (results.load(tmp_path / run / "results.json").details["curve"] for run in ("full", "cut"))
    assert [(r["step"], r["tokens"], r["loss"]) for r in ca] == [(r["step"], r["tokens"], r["loss"]) for r in cb]
    assert cb[-1]["cpu_s"] > cb[-2]["cpu_s"] > 0  # the clock carried over the resume


@pytest.mark.parametrize("path", sorted(p.relative_to(REPO) for p in (REPO / "recipes").rglob("config_*.yaml")), ids=str)
def test_every_shipped_recipe_loads(path):
    recipe = load_recipe(REPO / path)  # schema and cross-field checks only: nothing is loaded
    assert recipe.training.max_steps >= 1


def assert_same_losses_and_curve(root: Path) -> None:
    """The runs in root/one (1 process) and root/two (2 processes): the same 4 step losses and the same curve."""
    loss1, loss2 = ([r["loss"] for r in json.loads((root / run / "loss.json").read_text())] for run in ("one", "two"))
    assert len(loss1) == len(loss2) == 4
    torch.testing.assert_close(torch.tensor(loss2), torch.tensor(loss1), rtol=1e-4, atol=1e-5)
    curve1, curve2 = (results.load(root / run / "results.json").details["curve"] for run in ("one", "two"))
    assert [r["tokens"] for r in curve1] == [r["tokens"] for r in curve2] == [0, 256, 512]
    for a, b in zip(curve1, curve2):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4)
