"""The release self-check: the invariants a transformers release can break, run on a tiny peaky model.

A plug-in that reaches into transformers meets breaking releases (5.24 renamed the cache argument and
positions silently restarted at 0 under a cache). Past `compat.TESTED_THROUGH`, the first `patch` of each
model class and scheme in a process runs these checks on a tiny random model of the same class (the
generic shrink of `hf_posenc.tiny`, attention made peaky so a wrong position moves logits by O(1)):

- own == stock: the family's own scheme patched in gives the stock logits;
- takes effect: a scheme of the requested one's site moves the logits (a patch that silently stopped
  reaching the attention would pass every other check);
- cached == uncached: prefill then one token at a time == one forward (causal stacks);
- padded == alone: a left-padded row of a batch == the same prompt alone;
- unpatch exact: unpatching gives the stock logits bit for bit.

`HF_POSENC_SELF_CHECK=auto|always|never` (auto: only past TESTED_THROUGH). `hf-posenc doctor` runs the same
checks for every family on demand. Patching is passed in (`Patcher`), so this module sits below patching.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Any, Callable, Protocol

import torch
import transformers
from packaging.version import Version
from torch import nn

from . import compat, sites
from .catalog import get_scheme, list_architectures, supports, why_not
from .config import PosEncConfig, required_options
from .errors import PosEncError
from .registry import ADAPTERS
from .tiny import tiny_config, tiny_ids
from .view import read

ENV = "HF_POSENC_SELF_CHECK"
MODES = ("auto", "always", "never")
# values for the options a scheme requires, fit for the tiny model (width 64, head_dim 16)
REQUIRED_VALUES = {"factor": 2.0, "d_pos": 16}
TOLERANCE = 1e-4  # relative to the stock logits' scale; a wrong position costs O(1) with peaky weights
log = logging.getLogger("hf_posenc")


class Patcher(Protocol):
    def __call__(self, model: nn.Module, config: PosEncConfig) -> nn.Module: ...


@dataclasses.dataclass
class Check:
    name: str
    passed: bool
    detail: str = ""


@dataclasses.dataclass
class Report:
    model_class: str
    scheme: str
    checks: list[Check]
    seconds: float
    error: str = ""  # the tiny model could not be built or run: nothing was checked
    skipped: str = ""  # the class does not take the scheme (the patch itself then says why)

    @property
    def passed(self) -> bool:
        return not self.error and all(c.passed for c in self.checks)

    @property
    def status(self) -> str:
        return "skipped" if self.skipped else "pass" if self.passed else "FAIL"

    def failures(self) -> str:
        return self.error or "; ".join(f"{c.name}: {c.detail}" for c in self.checks if not c.passed)


def mode() -> str:
    value = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if value not in MODES:
        raise PosEncError(f"{ENV}={os.environ[ENV]!r} is not a mode; allowed: {', '.join(MODES)}")
    return value


def untested(version: str | None = None) -> bool:
    """The installed (or given) transformers is newer than the newest the whole suite passed on."""
    return Version(version or transformers.__version__) > Version(compat.TESTED_THROUGH)


_REPORTS: dict[tuple[type, str], Report] = {}  # one run per model class and scheme per process


def wanted() -> bool:
    """The mode asks for the check: `always`, or `auto` on a transformers past TESTED_THROUGH."""
    selected = mode()
    return selected == "always" or (selected == "auto" and untested())


def ensure(model: nn.Module, config: PosEncConfig, patch: Patcher, unpatch: Callable[[nn.Module], Any]) -> None:
    """Before `patch(model, config)` touches `model`: the checks on a tiny model of its class, once per class
    and scheme; PosEncError naming the version, the failed check and the fix if one fails. `patch` must not
    check again (it is called on the tiny model)."""
    model_class = type(model.get_base_model() if hasattr(model, "get_base_model") else model)  # under peft
    key = (model_class, config.scheme)
    if key not in _REPORTS:
        _REPORTS[key] = run(model_class, model.config.model_type, config, patch, unpatch)
        if _REPORTS[key].status == "pass":
            why = (f"transformers {transformers.__version__} is newer than {compat.TESTED_THROUGH}, the newest "
                   "hf-posenc was tested on; " if untested() else "")
            log.warning("hf-posenc: %sthe self-check of %s with %r passed (%.1f s)", why, model_class.__name__,
                        config.scheme, _REPORTS[key].seconds)
    report = _REPORTS[key]
    if report.passed:
        return
    found = (f"hf-posenc could not run its self-check of {config.scheme!r} on a tiny {report.model_class} under "
             f"transformers {transformers.__version__} ({report.error})" if report.error else
             f"transformers {transformers.__version__} breaks hf-posenc's {config.scheme!r} patch of "
             f"{report.model_class} (self-check: {report.failures()})")
    raise PosEncError(f"{found}; the newest transformers tested is {compat.TESTED_THROUGH}: pip install "
                      f"'transformers=={compat.TESTED_THROUGH}' (or set {ENV}=never to patch anyway, unchecked). "
                      "The model was not changed.")


def run(model_class: type, model_type: str, config: PosEncConfig, patch: Patcher,
        unpatch: Callable[[nn.Module], Any]) -> Report:
    """Every check of `config` on a tiny `model_class` of `model_type` (what `ensure` and `doctor` run)."""
    start = time.perf_counter()
    try:
        model = _tiny(model_class, model_type)
        if (reason := why_not(model, config.scheme)) is not None:
            return Report(model_class.__name__, config.scheme, [], time.perf_counter() - start, skipped=reason)
        checks = Probe(model).checks(config, patch, unpatch)
    except Exception as exc:  # noqa: BLE001 - whatever a new release raises is the finding
        return Report(model_class.__name__, config.scheme, [], time.perf_counter() - start,
                      f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300])
    return Report(model_class.__name__, config.scheme, checks, time.perf_counter() - start)


def _tiny(model_class: type, model_type: str) -> nn.Module:
    """A tiny `model_class`; BERT-style configs read as encoders unless the class is a causal LM."""
    config = tiny_config(model_type)
    if model_class not in transformers.AutoModelForCausalLM._model_mapping.values():
        config.is_decoder = False
    torch.manual_seed(0)
    build = getattr(model_class, "from_config", None) or model_class._from_config
    with torch.device("cpu"):
        return build(config).float().eval()


def check_config(scheme: str, stacks: Any = None) -> PosEncConfig:
    """`scheme` with its defaults, and the options it requires set for the tiny model."""
    return PosEncConfig(scheme, stacks=stacks, **{k: REQUIRED_VALUES[k] for k in required_options(scheme)})


def native_options(scheme: str, config: Any) -> dict[str, Any]:
    """Options restating a model's own scheme: a RoPE scaling needs its factor and friends from the config."""
    params = compat.rope_parameters(compat.text_config(config)) or {}
    fields = {f.name for f in dataclasses.fields(get_scheme(scheme).Options)}
    if params.get("rope_type", "default") == "default" or "factor" not in fields:
        return {}
    return {**{k: v for k, v in params.items() if k in fields}, "theta": params["rope_theta"]}


class Probe:
    """One tiny model, its inputs and stock logits; each check patches it and unpatches it again."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        view = read(model)
        self.two_stacks = view.two_stacks
        self.adapter = view.adapter(view.text[-1]) if self.two_stacks else view.only()
        self.inputs = self._inputs(tiny_ids(batch=2, length=10))
        self.stock = self.logits(**self.inputs)

    def _inputs(self, ids: torch.Tensor, **extra: Any) -> dict[str, Any]:
        """`ids` as the input (an encoder-decoder's decoder reads the first 6 ids of the unpadded batch)."""
        if not self.two_stacks:
            return {"input_ids": ids, **extra}
        return {"input_ids": ids, "decoder_input_ids": tiny_ids(batch=2, length=10)[: ids.shape[0], :6], **extra}

    def logits(self, **inputs: Any) -> torch.Tensor:
        """The head's logits, or the last hidden states of a bare base model."""
        with torch.no_grad():
            out = self.model(**inputs)
        return (out.logits if getattr(out, "logits", None) is not None else out[0]).float()

    def close(self, got: torch.Tensor, want: torch.Tensor) -> str:
        """'' if equal within TOLERANCE of the logits' scale, else how far apart."""
        gap = float((got - want).abs().max())
        return "" if gap <= TOLERANCE * max(1.0, float(want.abs().max())) else f"{gap:.3g} apart"

    def checks(self, config: PosEncConfig, patch: Patcher, unpatch: Callable[[nn.Module], Any]) -> list[Check]:
        out: list[Check] = []
        native = self.adapter.native
        if why_not(self.model, native) is None:
            patch(self.model, PosEncConfig(native, **native_options(native, self.model.config)))
            out.append(self._check("own == stock", lambda: self.close(self.logits(**self.inputs), self.stock)))
            out.append(self._unpatch_exact(unpatch))
        probe_name, probe_options = sites.probe(get_scheme(config.scheme))
        if (probe_name, probe_options) != (native, {}) and why_not(self.model, probe_name) is None:
            patch(self.model, PosEncConfig(probe_name, **probe_options))
            out.append(self._check("takes effect", lambda: "" if self.close(self.logits(**self.inputs), self.stock)
                                   else f"{probe_name!r} left the logits as they were"))
            unpatch(self.model)
        self._patch_requested(config, patch)
        if self.adapter.causal:
            out.append(self._check("cached == uncached", self._cached_vs_uncached))
        out.append(self._check("padded == alone", self._padded_vs_alone))
        out.append(self._unpatch_exact(unpatch))
        return out

    def _patch_requested(self, config: PosEncConfig, patch: Patcher) -> None:
        """The user's options where the tiny model takes them, else without those sized for the real model
        (LongRoPE's lists of head_dim/2), else the check's own (a refused patch changes nothing)."""
        scalars = {k: v for k, v in config.options.items() if not isinstance(v, (list, tuple))}
        for options in (config.options, scalars):
            try:
                patch(self.model, PosEncConfig(config.scheme, stacks=config.stacks, **options))
                return
            except PosEncError:
                continue
        patch(self.model, check_config(config.scheme, config.stacks))

    @staticmethod
    def _check(name: str, compare: Callable[[], str]) -> Check:
        try:
            detail = compare()
        except Exception as exc:  # noqa: BLE001 - a release that makes the check raise fails it
            detail = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]
        return Check(name, not detail, detail)

    def _unpatch_exact(self, unpatch: Callable[[nn.Module], Any]) -> Check:
        unpatch(self.model)
        return self._check("unpatch exact", lambda: "" if torch.equal(self.logits(**self.inputs), self.stock)
                           else f"{self.close(self.logits(**self.inputs), self.stock) or 'not bit-identical'}")

    def _cached_vs_uncached(self) -> str:
        name = "decoder_input_ids" if self.two_stacks else "input_ids"
        ids, split = self.inputs[name], self.inputs[name].shape[1] - 3
        fixed = {k: v for k, v in self.inputs.items() if k != name}
        steps, cache, cache_name = [], None, compat.cache_kwarg(self.model)
        for start, stop in ((0, split), *((t, t + 1) for t in range(split, ids.shape[1]))):
            with torch.no_grad():
                out = self.model(**fixed, **{name: ids[:, start:stop], cache_name: cache}, use_cache=True)
            steps.append(out.logits.float())
            cache = compat.cache_out(out)
        return self.close(torch.cat(steps, dim=1), self.logits(**self.inputs))

    def _padded_vs_alone(self) -> str:
        pad = 3
        alone_ids = self.inputs["input_ids"][:1, :7]
        batch_ids = torch.cat((torch.cat((torch.zeros(1, pad, dtype=torch.long), alone_ids), dim=1),
                               self.inputs["input_ids"][1:]))
        mask = torch.ones_like(batch_ids)
        mask[0, :pad] = 0
        alone = self.logits(**self._inputs(alone_ids, attention_mask=torch.ones_like(alone_ids)))
        batch = self.logits(**self._inputs(batch_ids, attention_mask=mask))
        return self.close(batch[:1] if self.two_stacks else batch[:1, pad:], alone)


# The families `hf-posenc doctor` checks by default: every hand-written adapter's model types and one model type
# of each family the generic adapter and the encoder-decoder stacks cover (DESIGN §6).
GENERIC_FAMILIES = ("gpt_neox", "phi", "opt", "bloom", "mpt", "falcon", "gemma3_text", "t5", "bart")


def families() -> list[str]:
    return [*list_architectures(), *GENERIC_FAMILIES]


def model_class_for(model_type: str) -> type:
    """The model class a user of `model_type` loads: seq-to-seq LM, masked LM for the encoder families,
    else causal LM."""
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSeq2SeqLM

    config_class = type(tiny_config(model_type))
    for auto in (AutoModelForSeq2SeqLM, AutoModelForMaskedLM if model_type in ADAPTERS and
                 not ADAPTERS[model_type].causal else None, AutoModelForCausalLM):
        if auto is not None and config_class in auto._model_mapping:
            return auto._model_mapping[config_class]
    raise PosEncError(f"model type {model_type!r} has no causal, masked or seq-to-seq LM class in transformers "
                      f"{transformers.__version__}")


def default_schemes(model_class: type, model_type: str) -> list[str]:
    """The family's own scheme and the scheme standing for each site it supports."""
    with torch.device("meta"):
        model = model_class._from_config(tiny_config(model_type))
    view = read(model)
    native = (view.adapter(view.text[-1]) if view.two_stacks else view.only()).native
    probes = [name for name, _ in sites.probes()]
    return list(dict.fromkeys(s for s in (native, *probes) if supports(model, s)))
