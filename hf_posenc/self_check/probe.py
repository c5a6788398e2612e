"""The checks themselves, on one tiny model: each patches it, compares what it outputs and unpatches it again.

What is compared follows the model's kind (`heads`): logits of a head with a row per token, hidden states of a bare
model or of a pooled head's base model. What a release can break
outside the forward pass is checked too: the patched model saved, then loaded back by plain transformers through
the folder's remote code (which loads through hf-posenc), and through the remote code of earlier hf-posenc versions.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

import torch
import transformers
from torch import nn

from .. import compat, sites
from ..catalog import get_scheme, why_not
from ..config import PosEncConfig, required_options
from ..errors import PosEncError
from ..writing import AUTO_CLASSES, LEGACY_REMOTE_CODE, REMOTE_CODE, remote_code
from ..tiny import tiny_ids
from ..view import read
from .heads import Head, primary

# values for the options a scheme requires, fit for the tiny model (width 64, head_dim 16)
REQUIRED_VALUES = {"factor": 2.0, "d_pos": 16}
TOLERANCE = 1e-4  # relative to the stock outputs' scale; a wrong position costs O(1) with peaky weights
PAD = 3  # left padding of the padded row


class Patcher(Protocol):
    def __call__(self, model: nn.Module, config: PosEncConfig) -> nn.Module: ...


@dataclasses.dataclass
class Check:
    name: str
    passed: bool
    detail: str = ""


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


@contextlib.contextmanager
def quiet_loads() -> Iterator[None]:
    """No progress bars or load reports from the check's own saves and loads."""
    was_enabled, verbosity = transformers.utils.logging.is_progress_bar_enabled(), transformers.logging.get_verbosity()
    transformers.utils.logging.disable_progress_bar()
    transformers.logging.set_verbosity_error()
    try:
        yield
    finally:
        transformers.logging.set_verbosity(verbosity)
        if was_enabled:
            transformers.utils.logging.enable_progress_bar()


class Probe:
    """One tiny model of one kind, its inputs and stock outputs. Building it runs only the stock model: an error
    here means the check cannot run (the caller says so), not that the patch is wrong."""

    def __init__(self, model: nn.Module, head: Head) -> None:
        self.model, self.head = model, head
        view = read(model)
        self.two_stacks = view.two_stacks
        self.adapter = view.adapter(view.text[-1]) if self.two_stacks else view.only()
        self.inputs = self._inputs(tiny_ids(batch=2, length=10))
        self.stock = self.outputs(**self.inputs)

    def _inputs(self, ids: torch.Tensor, **extra: Any) -> dict[str, Any]:
        """`ids` as the input (an encoder-decoder's decoder reads the first 6 ids of the unpadded batch)."""
        if not self.two_stacks:
            return {"input_ids": ids, **extra}
        return {"input_ids": ids, "decoder_input_ids": tiny_ids(batch=2, length=10)[: ids.shape[0], :6], **extra}

    def outputs(self, model: nn.Module | None = None, **inputs: Any) -> torch.Tensor:
        with torch.no_grad():
            return primary(self.head.reads(model or self.model)(**inputs))

    def close(self, got: torch.Tensor, want: torch.Tensor) -> str:
        """'' if equal within TOLERANCE of the outputs' scale, else how far apart."""
        if got.shape != want.shape:
            return f"shape {tuple(got.shape)} != {tuple(want.shape)}"
        gap = float((got - want).abs().max())
        return "" if gap <= TOLERANCE * max(1.0, float(want.abs().max())) else f"{gap:.3g} apart"

    def checks(self, config: PosEncConfig, patch: Patcher, unpatch: Callable[[nn.Module], Any]) -> list[Check]:
        out: list[Check] = []
        native = self.adapter.native
        if why_not(self.model, native) is None:
            patch(self.model, PosEncConfig(native, **native_options(native, self.model.config)))
            out.append(self._check("own == stock", lambda: self.close(self.outputs(**self.inputs), self.stock)))
            out.append(self._unpatch_exact(unpatch))
        probe_name, probe_options = sites.probe(get_scheme(config.scheme))
        if (probe_name, probe_options) != (native, {}) and why_not(self.model, probe_name) is None:
            patch(self.model, PosEncConfig(probe_name, **probe_options))
            out.append(self._check("takes effect", lambda: "" if self.close(self.outputs(**self.inputs), self.stock)
                                   else f"{probe_name!r} left the outputs as they were"))
            unpatch(self.model)
        self._patch_requested(config, patch)
        if self.adapter.causal:
            out.append(self._check("cached == uncached", self._cached_vs_uncached))
        out.append(self._check("padded == alone", self._padded_vs_alone))
        out.extend(self._reloads())
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
        return self._check("unpatch exact", lambda: "" if torch.equal(self.outputs(**self.inputs), self.stock)
                           else f"{self.close(self.outputs(**self.inputs), self.stock) or 'not bit-identical'}")

    def _cached_vs_uncached(self) -> str:
        """Prefill, then one token at a time == one forward."""
        model = self.head.reads(self.model)
        name = "decoder_input_ids" if self.two_stacks else "input_ids"
        ids, split = self.inputs[name], self.inputs[name].shape[1] - 3
        fixed = {k: v for k, v in self.inputs.items() if k != name}
        steps, cache, cache_name = [], None, compat.cache_kwarg(model)
        with torch.no_grad():
            whole = primary(model(**self.inputs))
            for start, stop in ((0, split), *((t, t + 1) for t in range(split, ids.shape[1]))):
                out = model(**fixed, **{name: ids[:, start:stop], cache_name: cache}, use_cache=True)
                steps.append(primary(out))
                cache = compat.cache_out(out)
        return self.close(torch.cat(steps, dim=1), whole)

    def _padded_vs_alone(self) -> str:
        alone_ids = self.inputs["input_ids"][:1, :7]
        batch_ids = torch.cat((torch.cat((torch.zeros(1, PAD, dtype=torch.long), alone_ids), dim=1),
                               self.inputs["input_ids"][1:]))
        mask = torch.ones_like(batch_ids)
        mask[0, :PAD] = 0
        alone = self.outputs(**self._inputs(alone_ids, attention_mask=torch.ones_like(alone_ids)))
        batch = self.outputs(**self._inputs(batch_ids, attention_mask=mask))
        return self.close(batch[:1] if self.two_stacks else batch[:1, PAD:], alone)

    def _reloads(self) -> list[Check]:
        """The patched model saved, then loaded by plain transformers (`trust_remote_code=True`, the folder's
        remote code calling hf-posenc's loader), with today's remote code and each earlier version's."""
        if self.head.auto not in AUTO_CLASSES or not self.head.builds(type(self.model), self.model.config):
            return []  # its folders name no remote class for this head, or no Auto class builds this class
        auto = getattr(transformers, self.head.auto)
        if not compat.saves_here():
            return []  # a process of several that is not rank 0: transformers saves nothing here (rank 0 checks)
        want = self.outputs(**self.inputs)
        out = []
        with tempfile.TemporaryDirectory() as tmp, quiet_loads():
            for code in (REMOTE_CODE, *LEGACY_REMOTE_CODE):
                # a fixed folder name: transformers keeps a copy of a folder's remote code under its name
                folder = Path(tmp) / f"hf_posenc_self_check_{Path(code).stem}"

                def reload(folder: Path = folder, code: str = code) -> str:
                    self.model.save_pretrained(folder)
                    (folder / REMOTE_CODE).write_text(remote_code(code), encoding="utf-8")
                    loaded = auto.from_pretrained(folder, trust_remote_code=True).float().eval()
                    return self.close(self.outputs(loaded, **self.inputs), want)

                label = "saved, reloaded" + ("" if code == REMOTE_CODE else f" by {Path(code).stem}'s remote code")
                out.append(self._check(label, reload))
        return out
