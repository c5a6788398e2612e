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
- saved, reloaded: the patched model saved and loaded back by plain transformers with `trust_remote_code=True`
  (through hf-posenc's loader), with today's remote code and with earlier versions' (folders users already have);
- unpatch exact: unpatching gives the stock logits bit for bit.

Every kind of model hf-posenc patches is fed what it takes and read for what it gives (`heads`). A check that
cannot run (no tiny model of the class can be built, or the stock tiny model does not run) is reported as such and
does not refuse the patch. The check leaves the caller's random states as they were (`random_state`), and its
verdict is kept on disk per (transformers, torch, hf-posenc, model class, scheme) (`verdicts`): a machine runs each
check once, not in every new process.

`HF_POSENC_SELF_CHECK=auto|always|never` (auto: only past TESTED_THROUGH). `hf-posenc doctor` runs the same
checks for every family on demand. Patching is passed in (`Patcher`), so this module sits below patching.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Any, Callable

import torch
import transformers
from packaging.version import Version
from torch import nn

from .. import compat, sites
from ..catalog import list_architectures, supports, why_not
from ..config import PosEncConfig
from ..errors import PosEncError
from ..adapters.base import ADAPTERS
from ..state import STATE_ATTR
from ..tiny import tiny_config
from ..view import read
from . import verdicts
from .heads import head_of
from .probe import Check, Patcher, Probe, check_config, native_options
from .random_state import untouched

__all__ = ["ENV", "MODES", "Check", "Patcher", "Report", "check_config", "default_schemes", "ensure", "families",
           "mode", "model_class_for", "native_options", "run", "untested", "wanted"]

ENV = "HF_POSENC_SELF_CHECK"
MODES = ("auto", "always", "never")
log = logging.getLogger("hf_posenc")


@dataclasses.dataclass
class Report:
    model_class: str
    scheme: str
    checks: list[Check]
    seconds: float
    skipped: str = ""  # the class does not take the scheme (the patch itself then says why)
    unchecked: str = ""  # no tiny model of the class could be built or run: nothing was checked, nothing refused
    # patching the tiny model raised: a finding for `doctor`; a patch goes ahead and raises the same itself (restoring
    # the model), or it does not, and either way says more than the tiny model's error would
    error: str = ""

    @classmethod
    def from_dict(cls, fields: dict[str, Any]) -> Report:
        return cls(**{**fields, "checks": [Check(**c) for c in fields["checks"]]})

    @property
    def passed(self) -> bool:
        return not self.error and all(c.passed for c in self.checks)

    @property
    def status(self) -> str:
        return ("skipped" if self.skipped else "unchecked" if self.unchecked else "pass" if self.passed
                else "FAIL")

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
_RUNNING: set[tuple[type, str]] = set()  # a check's own reload patches the same class: not checked again inside


def wanted() -> bool:
    """The mode asks for the check: `always`, or `auto` on a transformers past TESTED_THROUGH."""
    selected = mode()
    return selected == "always" or (selected == "auto" and untested())


def ensure(model: nn.Module, config: PosEncConfig, patch: Patcher, unpatch: Callable[[nn.Module], Any]) -> None:
    """Before `patch(model, config)` touches `model`: the checks on a tiny model of its class, once per class
    and scheme on a machine; PosEncError naming the version, the failed check and the fix if one fails. `patch` must
    not check again (it is called on the tiny model)."""
    model_class = type(model.get_base_model() if hasattr(model, "get_base_model") else model)  # under peft
    key = (model_class, config.scheme)
    if key in _RUNNING:
        return
    if key not in _REPORTS:
        _REPORTS[key] = _verdict(model_class, model.config.model_type, config, patch, unpatch)
        if _REPORTS[key].unchecked or _REPORTS[key].error:
            log.warning("hf-posenc: %sthe self-check of %s with %r could not run (%s); patching unchecked",
                        _why_checked(), model_class.__name__, config.scheme,
                        _REPORTS[key].unchecked or _REPORTS[key].error)
    report = _REPORTS[key]
    if report.unchecked or report.error or report.passed:
        return
    raise PosEncError(f"transformers {transformers.__version__} breaks hf-posenc's {config.scheme!r} patch of "
                      f"{report.model_class} (self-check: {report.failures()}); the newest transformers tested is "
                      f"{compat.TESTED_THROUGH}: pip install 'transformers=={compat.TESTED_THROUGH}' (or set {ENV}=never "
                      "to patch anyway, unchecked). The model was not changed.")


def _why_checked() -> str:
    return (f"transformers {transformers.__version__} is newer than {compat.TESTED_THROUGH}, the newest hf-posenc "
            "was tested on; " if untested() else "")


def _verdict(model_class: type, model_type: str, config: PosEncConfig, patch: Patcher,
             unpatch: Callable[[nn.Module], Any]) -> Report:
    """The verdict kept on disk for this stack, class and scheme, else a new run (which keeps its own)."""
    report = verdicts.load(verdicts.key(model_class, config.scheme), Report.from_dict)
    if report is None:
        report = run(model_class, model_type, config, patch, unpatch)
        if report.status == "pass":
            log.warning("hf-posenc: %sthe self-check of %s with %r passed (%.1f s; kept for this machine)",
                        _why_checked(), model_class.__name__, config.scheme, report.seconds)
    return report


def run(model_class: type, model_type: str, config: PosEncConfig, patch: Patcher,
        unpatch: Callable[[nn.Module], Any]) -> Report:
    """Every check of `config` on a tiny `model_class` of `model_type` (what `ensure` and `doctor` run), its verdict
    kept on disk for the next process; the caller's random states are left as they were."""
    start = time.perf_counter()
    key = (model_class, config.scheme)
    _RUNNING.add(key)
    try:
        with untouched():
            report = _run(model_class, model_type, config, patch, unpatch, start)
    finally:
        _RUNNING.discard(key)
    verdicts.store(verdicts.key(model_class, config.scheme), report)
    return report


def _run(model_class: type, model_type: str, config: PosEncConfig, patch: Patcher,
         unpatch: Callable[[nn.Module], Any], start: float) -> Report:
    def report(checks: list[Check], **why: str) -> Report:
        return Report(model_class.__name__, config.scheme, checks, time.perf_counter() - start, **why)

    try:
        model, head = _tiny(model_class, model_type)
        if getattr(model, STATE_ATTR, None) is not None:
            unpatch(model)  # a class that patches itself as it is built: the stock model is what is compared
        if (reason := why_not(model, config.scheme)) is not None:
            return report([], skipped=reason)
        probe = Probe(model, head)
    except Exception as exc:  # noqa: BLE001 - the stock tiny model does not build or run: nothing to check
        return report([], unchecked=_first_line(exc))
    try:
        return report(probe.checks(config, patch, unpatch))
    except Exception as exc:  # noqa: BLE001 - a patch that raises on the tiny model: the user's patch speaks
        return report([], error=f"patching the tiny model raised {_first_line(exc)}")


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]


def _tiny(model_class: type, model_type: str) -> tuple[nn.Module, Any]:
    """A tiny `model_class` and its kind; BERT-style configs read as encoders unless the class is a causal LM."""
    config = tiny_config(model_type)
    head = head_of(model_class, config)
    if head.auto != "AutoModelForCausalLM":
        config.is_decoder = False
    torch.manual_seed(0)
    build = getattr(model_class, "from_config", None) or model_class._from_config
    with torch.device("cpu"):
        return build(config).float().eval(), head


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
