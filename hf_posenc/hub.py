"""Publishing: a model card from a run folder, a repo that reloads as patched, and `push`.

A patched folder carries `config.auto_map` and the remote-code file that re-apply `config.posenc`
(see `hf_posenc.writing`); `export` adds them to folders saved before hf-posenc wrote them. `push`
stages the repo in a temporary copy, so the user's folder is never written to, whatever happens
to the upload.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from huggingface_hub import EvalResult, HfApi, ModelCard, ModelCardData, get_token
from huggingface_hub.errors import HfHubHTTPError, HFValidationError
from huggingface_hub.utils import validate_repo_id

from . import loading, results, writing, sites
from .catalog import get_scheme
from .config import LayerMap, PosEncConfig
from .errors import PosEncError
from .evaluation import load_results
from .folders import MARKER, gguf_mark
from .models import display_name, origin, provenance

__all__ = ["auto_classes", "export", "model_card", "push"]

TEMPLATES = resources.files("hf_posenc") / "model_cards"
CARD_TEMPLATE = "model_card.md"
# Accelerate training state (optimizer moments, RNG): only useful to `hf-posenc train --resume`.
NOT_PUBLISHED = ("checkpoints", MARKER)  # the marker names local paths: not for the Hub
HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")
NO_TOKEN = ("pushing to the Hub needs a token with write access: set HF_TOKEN=hf_..., run `hf auth login`, or pass "
            "a token (--token); tokens are at https://huggingface.co/settings/tokens")
# ---------------------------------------------------------------- reading a folder


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise PosEncError(f"{path} is not valid JSON ({err}); rewrite it or remove it") from err


def _published_files(folder: Path, pattern: str) -> list[Path]:
    """Files named `pattern` in the folder and its direct subfolders, minus what is not published."""
    found = [*folder.glob(pattern), *folder.glob(f"*/{pattern}")]
    return sorted(p for p in found if p.relative_to(folder).parts[0] not in NOT_PUBLISHED)


def _hub_id(name: Any) -> str | None:
    """`name` if it reads as a Hub repo id (owner/name) and is not a local path."""
    return name if isinstance(name, str) and HUB_ID.match(name) and not os.path.exists(name) else None


def auto_classes(config: dict[str, Any]) -> list[str]:
    """The transformers Auto classes that build the architecture saved in a config.json dict."""
    architectures = writing.stock_architectures(config)
    model_type = writing.stock_model_type(config) or config.get("model_type")
    if not architectures or not model_type:
        return []
    found = []
    # most specific first: the class a card loads the model with is the one that builds the saved architecture
    for auto_class in (auto for auto, (_, tag) in writing.AUTO_CLASSES.items() if tag is not None):
        classes = writing.built_by(auto_class).get(model_type, ())
        if architectures[0] in ((classes,) if isinstance(classes, str) else classes):
            found.append(auto_class)
    return found


# ---------------------------------------------------------------- model card


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _skipped(cell: dict[str, Any]) -> str:
    """Why a length was skipped, short and safe inside a Markdown table cell."""
    reason = " ".join(str(cell.get("skipped", "?")).split()).replace("|", "/")
    return f"skipped: {reason[:120]}"


def _entries(record: results.Results, run: results.Run) -> list[EvalResult]:
    """Model-index entries for the run that describes the published model."""
    entries = []
    for metric, spec in results.described([run], record.tables()):
        for key, cell in run.cells(metric):
            args = {k: cell[k] for k in ("stride", "target", "windows", "trials", "examples", "mode", "n") if k in cell}
            if (bounds := results.interval(cell, spec)) is not None:  # the rate's 95% Wilson interval
                args.update(ci95_low=round(bounds[0], 4), ci95_high=round(bounds[1], 4))
            if key.isdigit() and spec.unit == "tokens":
                args["context_length"] = int(key)
            for field in spec.fields:
                if isinstance(cell.get(field), (int, float)):
                    entries.append(EvalResult(
                        task_type=spec.task[0], task_name=spec.task[1] or metric, **spec.dataset(metric, key),
                        metric_type=field, metric_name=f"{results.field_name(metric, field)} @ {results.setting(spec, key)}",
                        metric_value=round(cell[field], 4), metric_args=args or None))
    return entries


def _table(record: results.Results) -> tuple[list[str], list[tuple[str, str, list[str]]]]:
    """A card table of one results file: a column per run, a row per metric, key and headline field."""
    rows = []
    for metric, spec in results.described(record.runs, record.tables()):
        keys = sorted({key for run in record.runs for key in run.metrics.get(metric, {})}, key=results.key_order)
        for key in keys:
            for field in spec.fields:
                values = []
                for run in record.runs:
                    cell = run.metrics.get(metric, {}).get(key)
                    bounds = results.interval(cell, spec) if cell is not None else None
                    values.append("–" if cell is None else _skipped(cell) if field not in cell
                                  else results.format_rate(cell[field], cell[spec.n], *bounds)
                                  if field == spec.rate and bounds and spec.n in cell else _fmt(cell[field]))
                rows.append((results.field_name(metric, field), results.setting(spec, key), values))
    return [run.label for run in record.runs], rows


def _hub_datasets(recipe: dict[str, Any], records: list[results.Results]) -> list[str]:
    """Hub datasets a card can link: what the recipe trained on and what eval read, minus the texts
    the package builds offline and local files."""
    names = [recipe.get("dataset_name")]
    for record in records:  # what each suite read from the Hub, as its section says (offline data is not)
        names += [name for section in record.suites.values() for name in section.hub_datasets]
    return sorted({name for name in names if isinstance(name, str) and (_hub_id(name) or not re.search(r"[./\\]", name))})


def _indexed_run(record: results.Results) -> results.Run | None:
    """The run that describes the model in the folder, for model-index metadata: an evaluation's only
    run, a training run's "after training"; the demo scores schemes, not the folder's model."""
    if record.kind == "eval":
        return record.runs[0] if record.runs else None
    return next((run for run in record.runs if run.label == "after training"), None) if record.kind == "train" else None


def model_card(folder: str | os.PathLike, base_model: str | None = None, *, repo_id: str | None = None) -> ModelCard:
    """A model card for a saved model, an `hf-posenc eval` output or a training run folder.

    Reads what is there: config.json (`config.posenc`: scheme, options, original scheme),
    run.json (the training recipe), every results.json in the folder and its direct subfolders
    (each a table with a column per run; the run that describes this model -- an evaluation's, a
    training run's "after training" -- becomes model-index metadata) and the PNG plots, embedded by
    relative path.

    Args:
        folder: the folder to describe.
        base_model: Hub id of the model it derives from; default: the recipe's or results' model
            when that is a Hub id.
        repo_id: where the card will live, used in the loading snippet and as model name.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise PosEncError(f"{folder} is not a folder; give a model, run or eval output folder")
    config = _read_json(folder / "config.json") if (folder / "config.json").is_file() else {}
    run_info = _read_json(folder / "run.json") if (folder / "run.json").is_file() else {}
    found = [(path.relative_to(folder).as_posix(), load_results(path))
             for path in _published_files(folder, "results.json")]
    if not config and not found and not run_info:
        raise PosEncError(f"{folder} has no config.json, run.json or results.json: nothing to describe")

    indexed = [(record, run) for _, record in found if (run := _indexed_run(record)) is not None]
    posenc = config.get("posenc") or next((run.posenc for _, run in indexed if run.posenc), None)
    recipe = run_info.get("recipe", {})
    # the model it derives from: the recipe's, else the evaluated one; what an earlier card said is kept
    source = recipe.get("model_name_or_path") or next((record.model for record, _ in indexed), None)
    earlier = ModelCard.load(folder / "README.md").data if (folder / "README.md").is_file() else ModelCardData()
    known_base, known_license = origin(source)
    base_model = base_model or earlier.base_model or known_base
    license = earlier.license or (known_license if base_model == known_base else origin(base_model)[1])
    classes = auto_classes(config)
    model_name = (repo_id or folder.resolve().name).split("/")[-1]
    entries = [entry for record, run in indexed for entry in _entries(record, run)]
    tables = [{"source": source, "kind": record.kind, **dict(zip(("columns", "rows"), _table(record))),
               "note": " ".join(record.notes()) or None}
              for source, record in found]

    posenc_view = None
    if posenc:
        described = PosEncConfig.from_dict(posenc)  # validates the format before anything is published
        specs = [get_scheme(entry.scheme)
                 for entry in (described.entries if isinstance(described, LayerMap) else (described,))]
        posenc_view = {
            "scheme": described.scheme, "options": described.options, "original": posenc.get("from") or "?",
            "site": ", ".join(dict.fromkeys(sites.title(spec) for spec in specs)),
            "layers": ", ".join(map(str, described.layers)) if described.layers else None,
            "citation": "; ".join(dict.fromkeys(spec.citation for spec in specs)),
            "json": json.dumps(posenc, sort_keys=True), "described": repr(described),
        }
    card_data = ModelCardData(
        base_model=base_model,
        license=license,
        datasets=_hub_datasets(recipe, [record for _, record in found]) or None,
        library_name="transformers",
        pipeline_tag=writing.AUTO_CLASSES[classes[0]][1] if classes else None,
        tags=["hf-posenc", "positional-encoding", *([f"posenc-{posenc_view['scheme']}"] if posenc_view else [])],
        model_name=model_name,
        eval_results=entries or None,
    )
    versions = next((record.versions for _, record in found), None)
    template = (TEMPLATES / CARD_TEMPLATE).read_text(encoding="utf-8")
    return ModelCard.from_template(
        card_data, template_str=template, model_name=model_name, posenc=posenc_view, provenance=provenance(source),
        architecture=(writing.stock_architectures(config) or [f"`{display_name(source)}`" if source else "model"])[0],
        loadable=bool(config), config_only=bool(posenc and config) and loading.config_only(config), auto_class=(classes or ["AutoModelForCausalLM"])[0],
        repo_id=repo_id or f"./{model_name}",
        recipe=yaml.safe_dump(recipe, sort_keys=False).strip() if recipe else None,
        world_size=run_info.get("world_size", 1), tables=tables,
        plots=[p.relative_to(folder).as_posix() for p in _published_files(folder, "*.png")],
        versions=", ".join(f"{k} {v}" for k, v in versions.items()) if versions else None,
    )


# ---------------------------------------------------------------- export and push


def _link_or_copy(src: str, dst: str) -> None:
    """Hard-link when the filesystem allows (weights can be many GB), else copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _staged_card(text: str, folder: Path, repo_id: str | None) -> str:
    """The folder's own card as staged for `repo_id`: the loading snippet `hf-posenc card` wrote for the local
    folder (`"./<name>"`) names the repo it is pushed to; the rest as the user left it."""
    return text if repo_id is None else text.replace(f'"./{folder.resolve().name}"', f'"{repo_id}"')


def _write_new(path: Path, text: str) -> None:
    path.unlink(missing_ok=True)  # never write through a hard link to the user's file
    path.write_text(text, encoding="utf-8")


def gguf_section(name: str, mark: dict[str, Any]) -> str:
    """The model card's part on a GGUF that hf-posenc wrote: what llama.cpp computes, and the commands that run it
    with the context the scheme was set for: hf-posenc's (the llama.cpp its set-up installs), then llama.cpp's own."""
    return (f"\n## llama.cpp\n\n`{name}` ({mark['dtype']}) is this model for llama.cpp, written by `hf-posenc export`. "
            f"It keeps {mark['kept']}, as llama.cpp's `{mark['architecture']}` architecture computes it. In a clone "
            "of hf-posenc, after `make llamacpp`, its script runs the file with the context it was written for and "
            "prints a greedy completion; llama.cpp's own `llama-cli` runs it too:\n\n"
            f"```\n.venv-llamacpp/bin/python scripts/llamacpp-generate {name} \"In the beginning\"\n"
            f"llama-cli -m {name} -c {mark['context']}\n```\n")


def gguf_of(gguf: str | os.PathLike, config: dict[str, Any]) -> dict[str, Any]:
    """What a GGUF says of itself, when hf-posenc wrote it of a model with this folder's patch; else PosEncError."""
    mark = gguf_mark(gguf)
    if mark is None:
        raise PosEncError(f"--gguf {gguf}: not a GGUF file hf-posenc wrote; write it with `hf-posenc export`")
    if mark.get("posenc") != config.get("posenc"):
        raise PosEncError(f"--gguf {gguf} keeps {mark.get('kept')}, not this folder's patch; export this folder")
    return mark


def stage_gguf(gguf: str | os.PathLike, mark: dict[str, Any], out: Path, link: bool) -> None:
    """Put the GGUF into the staged repo, named in its card."""
    (_link_or_copy if link else shutil.copy2)(str(gguf), str(out / Path(gguf).name))
    card = out / "README.md"
    _write_new(card, card.read_text(encoding="utf-8") + gguf_section(Path(gguf).name, mark))


def export(folder: str | os.PathLike, out: str | os.PathLike, *, base_model: str | None = None,
           repo_id: str | None = None, link: bool = False, gguf: str | os.PathLike | None = None) -> Path:
    """Write the repo `push` would upload into the new folder `out`; `folder` is only read.

    `out` holds the folder's files (minus training checkpoints), the model card as README.md
    (the folder's own README.md if it has one, its loading snippet naming `repo_id`; else `model_card(...)`) and, for a patched model,
    the remote-code file plus `auto_map` in config.json so `trust_remote_code=True` reloads the patch.

    Args:
        folder: a folder written by `save_pretrained` after `hf_posenc.patch` (or a training run).
        out: a path that does not exist yet.
        base_model, repo_id: as for `model_card`.
        link: hard-link the files instead of copying them. Only for a folder nobody writes to
            (push's staging): saving into a linked file in place would change the original.
        gguf: a GGUF file `hf-posenc export` wrote of this folder, staged beside it and named in the card.
    """
    folder, out = Path(folder), Path(out)
    if repo_id is not None:
        try:
            validate_repo_id(repo_id)
        except HFValidationError as err:
            raise PosEncError(f"{repo_id!r} is not a Hub repo id: {err}") from err
    if not (folder / "config.json").is_file():
        raise PosEncError(f"{folder} has no config.json: save the model there first (model.save_pretrained)")
    if not list(folder.glob("*.safetensors")):
        raise PosEncError(f"{folder} has no *.safetensors weights: save them with model.save_pretrained")
    if out.exists():
        raise PosEncError(f"{out} already exists; export writes a new folder")
    if out.resolve().is_relative_to(folder.resolve()):
        raise PosEncError(f"{out} is inside {folder}; export to a folder outside it")
    config = _read_json(folder / "config.json")
    if config.get("posenc"):
        PosEncConfig.from_dict(config["posenc"])  # a format this hf-posenc cannot read must not be published
        config_only = loading.config_only(config)
    card = model_card(folder, base_model, repo_id=repo_id) if not (folder / "README.md").is_file() else \
        _staged_card((folder / "README.md").read_text(encoding="utf-8"), folder, repo_id)
    mark = gguf_of(gguf, config) if gguf is not None else None
    shutil.copytree(folder, out, ignore=shutil.ignore_patterns(*NOT_PUBLISHED),
                    copy_function=_link_or_copy if link else shutil.copy2)
    if config.get("posenc"):
        writing.mark_folder(out, config_only)  # writes new files, never through the links
    _write_new(out / "README.md", str(card))
    if gguf is not None:
        stage_gguf(gguf, mark, out, link)
    return out


def push(folder: str | os.PathLike, repo_id: str, *, token: str | None = None, private: bool = False,
         commit_message: str = "Upload model patched with hf-posenc", base_model: str | None = None,
         gguf: str | os.PathLike | None = None) -> str:
    """Upload a model folder to the Hub as a repo that reloads patched; returns the commit URL.

    The repo is staged by `export` in a temporary folder, then sent with `HfApi.create_repo` and
    `upload_folder`; the local folder is never modified or deleted, also when the upload fails.

    Args:
        folder: the model folder (see `export`).
        repo_id: "owner/name" or "name" (under the token's user).
        token: a Hub token; default: the one `hf auth login` stored or HF_TOKEN.
        private: create the repo private (an existing repo keeps its visibility).
        commit_message: the Hub commit message.
        base_model: Hub id of the model it derives from, for the card.
        gguf: a GGUF of the folder (`hf-posenc export`) to upload beside it (opt-in).
    """
    if not (token or get_token()):  # huggingface_hub would send the request anyway and fail later
        raise PosEncError(f"{NO_TOKEN}; the local folder is unchanged")
    with tempfile.TemporaryDirectory(prefix="hf-posenc-push-") as tmp:
        staged = export(folder, Path(tmp) / "repo", base_model=base_model, repo_id=repo_id, link=True, gguf=gguf)
        api = HfApi(token=token)
        try:
            api.create_repo(repo_id, private=private, exist_ok=True)
            commit = api.upload_folder(repo_id=repo_id, folder_path=staged, commit_message=commit_message)
        except HfHubHTTPError as err:
            refused = err.response is not None and err.response.status_code in (401, 403)
            raise PosEncError(f"upload of {folder} to {repo_id!r} failed ({err})"
                              f"{'; ' + NO_TOKEN if refused else ''}; the local folder is unchanged") from err
        except Exception as err:  # transport errors are requests/httpx/httpx2 types, by huggingface_hub version
            raise PosEncError(f"upload of {folder} to {repo_id!r} failed ({type(err).__name__}: {err}); "
                              f"the local folder is unchanged") from err
    return commit.commit_url
