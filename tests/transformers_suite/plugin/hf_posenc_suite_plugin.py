"""pytest plugin: every model transformers' own tests build is patched with hf-posenc (issue 37).

Loaded into a run of transformers' test files (`-p hf_posenc_suite_plugin`, this folder on PYTHONPATH: it sits
outside any package named `tests`, which transformers' tree has). `HF_POSENC_SUITE_CELLS` says what to patch: a
JSON list of cells `{"label": "alibi", "patch": ..., "select": regex or null}`, each a copy of the tests whose
`TestClass::test_method` the regex finds, run on models patched with `patch`: a scheme name (`"alibi"`), an
object with `scheme` and options (`{"scheme": "yarn", "factor": 2.0}`) or a layer map (`{"nope": [0], "rope":
[1]}`); `null` is the stock cell (the tests themselves, unpatched). A bare scheme name is one cell over every
test. Without it the plugin does nothing. Cells in one process share its start-up (~10 s of imports and
collection per process).

Where models are caught, as a user would patch them:
- built (`Model(config)`, `from_config`): `PreTrainedModel.post_init` ends every model's `__init__`; the
  outermost model is patched there, never a sub-model built inside another one (a `LlamaModel` inside
  `LlamaForCausalLM` is the same model);
- loaded from a folder a patched model saved (config.json has `posenc`): through `hf_posenc.from_pretrained`,
  the documented way back;
- loaded from anything else (a stock folder): plain `from_pretrained`, then `hf_posenc.patch`; a bare
  `state_dict=` (no folder) loads into a model patched as it is built, so the patch's own keys land.
A model the scheme does not apply to (`hf_posenc.supports` says no) stays stock. What happened is recorded per
test as junit properties (`posenc_patched`, `posenc_stock`, `posenc_error`), so a test in which nothing was
patched is not counted as a pass on a patched model. Wrapping transformers' classes is fine here: this is the
test process of a harness, never the package.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import zlib
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import transformers

ENV = "HF_POSENC_SUITE_CELLS"
RECORDS: list[dict[str, str]] = []  # what happened to each model of the running test
ROUTING = {"depth": 0}  # > 0 inside a load the plugin routes: transformers' own calls underneath pass through
CURRENT: dict[str, Any] = {"patch": None}  # the patch of the running test; None: stock
CELLS = pytest.StashKey[list]()  # on the config: the run's cells
CELL = pytest.StashKey[dict]()  # on an item: its cell


def cells_from_env() -> list[dict[str, Any]] | None:
    """The cells of this run, [{"label", "patch", "select"}]; a bare scheme name or patch is one cell."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw  # a bare scheme name
    if isinstance(value, list):
        return value
    return [{"label": value if isinstance(value, str) else "patched", "patch": value, "select": None}]


def schemes_of(spec: Any) -> list[str]:
    """The scheme names a spec installs."""
    if isinstance(spec, str):
        return [spec]
    return [spec["scheme"]] if "scheme" in spec else list(spec)


def layer_count(model: Any) -> int | None:
    """Attention layers per stack, from the config (tests shrink models to 1-5 layers)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    for name in ("num_hidden_layers", "n_layer", "num_layers"):
        if isinstance(getattr(config, name, None), int):
            return getattr(config, name)
    return None


def fitted(spec: Any, layers: int | None) -> Any:
    """A layer map cut to the layers this model has (a test may build a 1-layer model); None if none is left."""
    if isinstance(spec, str) or "scheme" in spec or layers is None:
        return spec
    kept = {name: [i for i in idx if i < layers] for name, idx in spec.items()}
    kept = {name: idx for name, idx in kept.items() if idx}
    return kept or None


def as_patch(spec: Any) -> Any:
    """The argument `hf_posenc.patch` takes for a spec."""
    import hf_posenc

    if isinstance(spec, dict) and "scheme" in spec:
        return hf_posenc.PosEncConfig(**spec)
    return spec


def record(model: Any, how: str, state: str, detail: str = "") -> None:
    RECORDS.append({"class": type(model).__name__, "how": how, "state": state, "detail": detail})


def nested(model: Any) -> bool:
    """Whether `model` is being built inside another transformers model's `__init__` (a sub-model)."""
    from transformers import PreTrainedModel

    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "__init__":
            owner = frame.f_locals.get("self")
            if owner is not model and isinstance(owner, PreTrainedModel):
                return True
        frame = frame.f_back
    return False


def patch_model(model: Any, spec: Any, how: str) -> None:
    """Patch `model` as a user would, or leave it stock where the scheme does not apply, and record which.
    A patch that fails on a model `supports` accepts raises, as it would for the user."""
    with routed():  # models hf-posenc builds itself (meta copies, self-checks) are not the test's
        patch_routed(model, spec, how)


def patch_routed(model: Any, spec: Any, how: str) -> None:
    import hf_posenc

    if hf_posenc.describe(model) is not None:
        record(model, how, "patched", "already")
        return
    unsupported = [name for name in schemes_of(spec) if not hf_posenc.supports(model, name)]
    if unsupported:
        record(model, how, "stock", f"supports() is False for {', '.join(unsupported)}")
        return
    fit = fitted(spec, layer_count(model))
    if fit is None:
        record(model, how, "stock", f"no layer of the map in its {layer_count(model)} layers")
        return
    try:
        hf_posenc.patch(model, as_patch(fit))
    except Exception as err:
        record(model, how, "error", f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
        raise
    record(model, how, "patched", "" if fit == spec else f"map cut to {fit}")


@contextlib.contextmanager
def routed() -> Iterator[None]:
    ROUTING["depth"] += 1
    try:
        yield
    finally:
        ROUTING["depth"] -= 1


def saved_patched(path: Any) -> bool:
    """Whether `path` is a folder a patched model saved (its config.json carries `posenc`)."""
    if not isinstance(path, (str, os.PathLike)) or not (Path(path) / "config.json").is_file():
        return False
    try:
        return "posenc" in json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False


def wrap_post_init(original: Callable[..., Any]) -> Callable[..., Any]:
    def post_init(self: Any) -> None:
        """transformers' post_init, then the patch of a top-level model built from a config."""
        original(self)
        if CURRENT["patch"] is not None and not ROUTING["depth"] and not nested(self):
            patch_model(self, CURRENT["patch"], "built")

    return post_init


def wrap_from_pretrained(original: Callable[..., Any]) -> Callable[..., Any]:
    def from_pretrained(cls: type, path: Any = None, *args: Any, **kwargs: Any) -> Any:
        """A patched folder through hf_posenc.from_pretrained; anything else loaded stock, then patched."""
        if path is None:  # given by keyword, as test_eager_matches_sdpa_inference does
            path = kwargs.pop("pretrained_model_name_or_path", None)
        if ROUTING["depth"] or CURRENT["patch"] is None:
            return original(cls, path, *args, **kwargs)
        import hf_posenc

        if path is None and kwargs.get("state_dict") is not None:
            # a patched model's own state dict (test_from_pretrained_no_checkpoint): loaded, keys and all, into a
            # model patched as it is built; no folder for hf_posenc.from_pretrained to read
            return original(cls, path, *args, **kwargs)
        reload = saved_patched(path) and not args
        with routed():
            if reload:
                result = hf_posenc.from_pretrained(path, model_cls=cls, **kwargs)
            else:
                result = original(cls, path, *args, **kwargs)
        model = result[0] if isinstance(result, tuple) else result
        if reload:
            state = "patched" if hf_posenc.describe(model) is not None else "stock"
            record(model, "reloaded", state, "through hf_posenc.from_pretrained")
        else:
            patch_model(model, CURRENT["patch"], "loaded")
        return result

    return from_pretrained


def install() -> None:
    """Wrap the construction and loading seams of transformers in this process."""
    from transformers import PreTrainedModel
    from transformers.models.auto.auto_factory import _BaseAutoModelClass

    PreTrainedModel.post_init = wrap_post_init(PreTrainedModel.post_init)
    # each Auto class holds its own copy of from_pretrained (transformers' auto_class_update)
    for owner in (PreTrainedModel, *subclasses(_BaseAutoModelClass)):
        if "from_pretrained" in vars(owner):
            owner.from_pretrained = classmethod(wrap_from_pretrained(owner.from_pretrained.__func__))


def subclasses(cls: type) -> list[type]:
    """`cls` and every class below it."""
    return [cls, *(sub for child in cls.__subclasses__() for sub in subclasses(child))]


def relabelled(item: pytest.Item, label: str) -> pytest.Item:
    """A second item running the same unittest method, with id `...::test_x[posenc=label]`."""
    clone = type(item).from_parent(item.parent, name=item.name)
    nodeid = f"{item.nodeid}[posenc={label}]"
    if hasattr(clone, "_id"):  # pytest >= 9 keeps a structured id
        clone._id = type(clone._id).parse(nodeid)
    else:
        clone._nodeid = nodeid
    return clone


def pytest_configure(config: pytest.Config) -> None:
    cells = cells_from_env()
    config.stash[CELLS] = cells
    if cells and any(cell["patch"] is not None for cell in cells):
        install()


def case_name(item: pytest.Item) -> str:
    """What a cell's `select` regex is searched in: `TestClass::test_method`."""
    return f"{item.parent.name}::{item.name}" if item.parent is not None else item.name


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each cell's selection, as a copy of each selected test labelled with the cell (a stock cell: the tests
    themselves); tests no cell selects are deselected."""
    cells = config.stash[CELLS]
    if not cells:
        return
    kept: list[pytest.Item] = []
    for cell in cells:
        chosen = [item for item in items if not cell.get("select") or re.search(cell["select"], case_name(item))]
        for item in chosen:
            copy = item if cell["patch"] is None else relabelled(item, cell["label"])
            copy.stash[CELL] = cell
            kept.append(copy)
    chosen_ids = {id(item) for item in kept}
    config.hook.pytest_deselected(items=[item for item in items if id(item) not in chosen_ids])
    items[:] = kept


def pytest_report_header(config: pytest.Config) -> str:
    cells = config.stash[CELLS] or []
    return f"hf-posenc suite plugin: {len(cells)} cell(s): {', '.join(cell['label'] for cell in cells)}"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    RECORDS.clear()
    CURRENT["patch"] = item.stash.get(CELL, {}).get("patch")
    # the same random draws for a test in every cell and worker, whatever ran before it: tolerance tests (fp16
    # logits, padded against padding-free) compared stock against patched must not turn on the order xdist ran
    # them in (bert p_rope failed one by 0.0084 against 0.0078 in a full run and passed alone)
    transformers.set_seed(zlib.crc32(case_name(item).encode()))


def pytest_runtest_teardown(item: pytest.Item) -> None:
    CURRENT["patch"] = None


def summary() -> list[tuple[str, str]]:
    """junit properties: which classes were patched, left stock (and why), or failed to patch."""
    found: dict[str, dict[str, str]] = {"patched": {}, "stock": {}, "error": {}}
    for entry in RECORDS:
        found[entry["state"]].setdefault(f"{entry['class']} ({entry['how']})", entry["detail"])
    return [(f"posenc_{state}", "; ".join(k if state == "patched" else f"{k}: {v}" for k, v in sorted(names.items())))
            for state, names in found.items() if names]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[Any]:
    outcome = yield
    report = outcome.get_result()
    if call.when == "teardown":  # junitxml writes the properties of the teardown report
        report.user_properties = [*report.user_properties, *summary()]
