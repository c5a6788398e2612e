"""The run folder: whether a run may write there (`preflight`, once per run), its run file, and the
checkpoints Trainer writes in it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

import datasets

from .. import folders
from ..errors import PosEncError
from . import inputs, modeling, tasks
from .recipe import Recipe, field_defaults

RUN_FILE = "run.json"
STATE_FILE = "trainer_state.json"  # Trainer writes it last into a checkpoint: its presence means complete
CHECKPOINTS = "checkpoints"
# Fields that may change between a run and its resume; anything else means a different run.
RESUMABLE_CHANGES = {"max_steps", "save_steps", "save_strategy", "save_total_limit", "logging_steps", "report_to",
                     "eval_original", "eval_before", "eval_after", "eval_every_steps", "perplexity_lengths",
                     "eval_max_windows", "per_device_eval_batch_size", "output_dir", "merge_lora", "save_model", "plot",
                     "eval_strategy", "eval_steps", "eval_on_start", "num_train_epochs"}


def checkpoints(out: Path) -> list[Path]:
    """Complete checkpoints (Trainer's `checkpoint-N`, its state file written last), oldest first."""
    root = out / CHECKPOINTS
    found = [p for p in root.glob("checkpoint-*") if (p / STATE_FILE).is_file()] if root.is_dir() else []
    return sorted(found, key=lambda p: int(p.name.split("-")[1]))


def _diff(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    return [name for name in sorted(set(a) | set(b)) if a.get(name) != b.get(name) and name not in RESUMABLE_CHANGES]


def check_output(recipe: Recipe, resume: bool | str, overwrite: bool) -> tuple[bool, bool]:
    """Refuse to write into a folder that holds another run unless told to resume or overwrite.
    `resume` is True (continue from the latest checkpoint, which must exist) or "auto" (continue if
    there is a checkpoint, else start over); returns the (resume, overwrite) this run does.

    A run of this recipe that never finished and saved no checkpoint (stopped before its first save, or under
    `save_strategy: "no"`) is started over by a rerun, as eval takes back its own interrupted folder: nothing in it
    can be continued or is lost, so the user who runs the command again gets the run, not a refusal naming
    --resume, which could only refuse in turn. Any other run is replaced only by --overwrite."""
    out = Path(recipe.training.output_dir)
    where = f"{recipe.source}: output_dir"
    if resume and overwrite:
        raise PosEncError("--resume and --overwrite exclude each other")
    folders.check_separate(out, input_paths(recipe), flag=where)
    if out.is_file():
        raise PosEncError(f"{where}: {str(out)!r} is a file; give a folder (new or empty)")
    found = checkpoints(out)
    resume = bool(found) if resume == "auto" else resume
    if not out.exists() or not any(out.iterdir()):
        if resume:
            raise PosEncError(f"{where}: --resume: {str(out)!r} has no checkpoint to continue from; run without "
                              "--resume to start, or pass --resume auto to start when there is none")
        return False, overwrite
    if folders.is_marked(out) and not folders.replaceable(out, "train"):  # another command's folder
        folders.check_replace(out, "train", flag=where)
    if not (out / RUN_FILE).is_file():
        raise PosEncError(f"{where}: {str(out)!r} is not empty and holds no hf-posenc run; choose a new or empty folder")
    if overwrite:
        if not folders.is_marked(out):
            raise PosEncError(f"{where}: --overwrite: {str(out)!r} has no {folders.MARKER} marker, so this "
                              f"hf-posenc did not write it (an older version may have): {folders.ASK}")
        return False, True
    if not found:
        again = folders.incomplete(out, "train") and not _recipe_changes(out, recipe)
        if again and not resume:
            return False, True
        raise PosEncError(f"{where}: {'--resume: ' if resume else ''}{str(out)!r} already holds a run, with no "
                          "checkpoint to continue from; " + ("run without --resume to start it over" if again else
                                                             "pass --overwrite to replace it"))
    if not resume:
        raise PosEncError(f"{where}: {str(out)!r} already holds a run; pass --resume to continue it or --overwrite to replace it")
    if _before_trainer(out):
        raise PosEncError(f"{where}: cannot resume {str(out)!r}: its run and checkpoints were written by the training "
                          "loop hf-posenc had before recipes ran on transformers' Trainer (a recipe of sections: "
                          "model:, data:, training:), whose state Trainer cannot continue; pass --overwrite to start "
                          "it again (the model saved there still loads)")
    if changed := _recipe_changes(out, recipe):
        raise PosEncError(f"{where}: cannot resume {str(out)!r}: the recipe changed in {', '.join(changed)}")
    return True, False


def input_paths(recipe: Recipe) -> dict[str, str | None]:
    """What the run reads, by recipe field (built-in dataset names are no paths)."""
    data = None if recipe.data.dataset_name in inputs.BUILTIN else recipe.data.dataset_name
    return {"model_name_or_path": recipe.model.model_name_or_path,
            "tokenizer_name_or_path": recipe.model.tokenizer_name_or_path, "dataset_name": data, "the recipe": recipe.source}


def _saved_recipe(out: Path) -> dict[str, Any]:
    """The recipe run.json recorded, or a PosEncError naming the damaged file."""
    try:
        saved = json.loads((out / RUN_FILE).read_text())["recipe"]
    except (ValueError, KeyError, TypeError):
        raise PosEncError(f"{out / RUN_FILE}: damaged (not the JSON of a run with its recipe); pass --overwrite to "
                          "start the run again") from None
    if not isinstance(saved, dict):
        raise PosEncError(f"{out / RUN_FILE}: damaged (its recipe is not a mapping); pass --overwrite to start again")
    return saved


def _before_trainer(out: Path) -> bool:
    """A run of the loop before Trainer: its recipe had sections, which no field of today's is."""
    return any(isinstance(_saved_recipe(out).get(section), dict) for section in ("model", "data", "training"))


def _recipe_changes(out: Path, recipe: Recipe) -> list[str]:
    """The fields that changed; one the saved recipe lacks (a field added since it ran) counts at its default."""
    return _diff({**json.loads(json.dumps(field_defaults(), default=str)), **_saved_recipe(out)}, recipe.to_dict())


class Checked(NamedTuple):
    """What `preflight` found, for `train` to start from: the raw data (None: load it at setup, as a
    process launched after the checks does) and the resume and overwrite the run does, settled."""

    raw: datasets.DatasetDict | None
    resume: bool
    overwrite: bool


def preflight(recipe: Recipe, resume: bool | str, overwrite: bool, world_size: int) -> Checked:
    """Every check that needs no compute: output folder, scheme support, dataset columns, batch split.
    Run once per run, before any process starts; returns the raw data and the (resume, overwrite) the run
    does (see `check_output`)."""
    total, micro = recipe.posenc.global_batch_size, recipe.training.per_device_train_batch_size
    if total is not None and total % (micro * world_size):
        fits = [m for m in range(micro, 0, -1) if total % (m * world_size) == 0]
        fix = f"--per_device_train_batch_size {fits[0]}" if fits else f"a global_batch_size that is a multiple of {world_size}"
        raise PosEncError(f"{recipe.source}: global_batch_size: {total} does not split into micro-batches of {micro} "
                          f"on {world_size} process(es); use {fix}")
    resume, overwrite = check_output(recipe, resume, overwrite)
    config = modeling.load_config(recipe)
    tasks.check_model(recipe, config)
    modeling.check_scheme(recipe, config)
    return Checked(inputs.load_raw(recipe), resume, overwrite)
