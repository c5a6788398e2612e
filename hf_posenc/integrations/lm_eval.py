"""lm-evaluation-harness: the `hf-posenc` model type, which patches on the fly, and offline tasks.

    python -m hf_posenc.integrations.lm_eval --model hf-posenc \\
        --model_args pretrained=smollm2,scheme=yarn,factor=4 --tasks posenc_kjv --device cpu

`main` registers the model type and hands its arguments to lm-eval's own command line, adding
`--include_path LM_EVAL_TASK_DIR` (the offline tasks `posenc_kjv`, `posenc_sentiment`, `posenc_passkey`; the
tag `posenc` runs all three). From Python, `import hf_posenc.integrations.lm_eval` registers the
model type for `lm_eval.simple_evaluate(model="hf-posenc", ...)`.

`pretrained` is a package model name (`smollm2`), a folder or a Hub id; folders saved after
`hf_posenc.patch` load back patched. `scheme=` patches after loading; every `--model_args` key that is
neither an `HFLM` argument nor in `LOADING_KWARGS` is an option of that scheme, typed and validated by
`PosEncConfig` before any weights load.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

import transformers
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM

from ..catalog import list_schemes, supports, why_not
from ..config import PosEncConfig
from ..errors import PosEncError
from ..loading import from_pretrained, read_config
from ..models import NAMED_MODELS
from ..patching import describe, patch
from ..unpacked import unpacked_folder
from .lm_eval_index import LM_EVAL_TASK_DIR

__all__ = ["LM_EVAL_TASK_DIR", "LOADING_KWARGS", "MODEL_TYPE", "PosEncLM", "main"]

MODEL_TYPE = "hf-posenc"
# `from_pretrained` arguments that lm-eval passes through **kwargs; anything else unnamed is a scheme option.
LOADING_KWARGS = frozenset({
    "attn_implementation", "device_map", "max_memory", "low_cpu_mem_usage", "cache_dir", "token", "local_files_only",
    "variant", "use_safetensors", "load_in_8bit", "load_in_4bit", "bnb_4bit_compute_dtype", "bnb_4bit_quant_type",
    "bnb_4bit_use_double_quant",
})
HFLM_ARGS = frozenset(inspect.signature(HFLM.__init__).parameters) - {"self", "kwargs"}


class _PatchingLoader:
    """Stands in for HFLM's Auto class while it loads, so every HFLM loading path (dtype, device map,
    GGUF, peft adapters on top) gets the model from `hf_posenc.from_pretrained`, patched."""

    def __init__(self, model_cls: type, config: PosEncConfig | None) -> None:
        self.model_cls, self.config = model_cls, config

    def from_pretrained(self, path: str, **kwargs: Any) -> transformers.PreTrainedModel:
        model = from_pretrained(path, model_cls=self.model_cls, **kwargs)
        return patch(model, self.config) if self.config is not None else model


@register_model(MODEL_TYPE)
class PosEncLM(HFLM):
    """lm-eval's `hf` model on a model loaded with `hf_posenc.from_pretrained` and optionally patched.

    Args:
        pretrained: a package model name (`hf_posenc.models.NAMED_MODELS`), a folder, a Hub id or a
            model instance (patched in place when `scheme` is given).
        scheme: patch this scheme after loading (`hf_posenc.list_schemes()`); None keeps the model's own.
        **kwargs: `HFLM` arguments (max_length, dtype, batch_size, ...), `from_pretrained` arguments
            in `LOADING_KWARGS`, and the scheme's options (factor=4, theta=1e4, ...).
    """

    def __init__(self, pretrained: str | transformers.PreTrainedModel, scheme: str | None = None,
                 **kwargs: Any) -> None:
        options = {k: kwargs.pop(k) for k in list(kwargs) if k not in HFLM_ARGS | LOADING_KWARGS}
        if options and scheme is None:
            raise PosEncError(
                f"model_args {', '.join(sorted(options))} are not lm-eval arguments; if they are scheme options, "
                "also pass scheme=<name> (see `hf-posenc list`)"
            )
        # Validated before anything loads: a typo costs no model load.
        self.posenc = PosEncConfig(scheme, **options) if scheme else None
        if isinstance(pretrained, str) and pretrained in NAMED_MODELS:  # a packaged GGUF: its copy unpacked once
            pretrained = str(unpacked_folder(pretrained))
        # A model in memory goes in by its name, and `_get_config` / `_create_model` hand HFLM the object: HFLM's
        # path for model objects warns that its arguments may be ignored, and skips the checks of this class.
        self.in_memory = None if isinstance(pretrained, str) else pretrained
        if self.in_memory is not None:
            kwargs.setdefault("device", str(self.in_memory.device))
            # a model accelerate spread over devices stays where it is (HFLM moves a single-device one to `device`)
            kwargs.setdefault("parallelize", len(set(getattr(self.in_memory, "hf_device_map", {}).values())) > 1)
            pretrained = self.in_memory.name_or_path
        super().__init__(pretrained=pretrained, **kwargs)

    def _get_config(self, pretrained: str, *, trust_remote_code: bool = False, **kwargs: Any) -> None:
        """Read the config in any layout hf-posenc saves (remote code is never needed), or take the given model's,
        then check the scheme fits the architecture before HFLM loads any weights."""
        self._config = read_config(pretrained, **kwargs) if self.in_memory is None else self.in_memory.config
        if self.posenc is None:
            return
        model_type = getattr(self._config, "model_type", None)
        try:  # the hand-written adapter, else the generic one read from a meta-device model of the config
            reason = why_not(self._config, self.posenc.scheme)
        except PosEncError as exc:
            raise PosEncError(f"{pretrained}: hf-posenc cannot patch {model_type!r} models: {exc}") from exc
        if reason is not None:
            allowed = [s for s in list_schemes() if supports(self._config, s)]
            raise PosEncError(f"{pretrained}: {model_type!r} models cannot take scheme "
                                        f"{self.posenc.scheme!r}; supported: {', '.join(allowed)} ({reason})")

    def _create_model(self, pretrained: str, **kwargs: Any) -> None:
        if self.in_memory is not None:
            self._model = patch(self.in_memory, self.posenc) if self.posenc is not None else self.in_memory
            return
        auto_class = self.AUTO_MODEL_CLASS
        self.AUTO_MODEL_CLASS = _PatchingLoader(auto_class, self.posenc)
        try:
            super()._create_model(pretrained, **kwargs)
        finally:
            self.AUTO_MODEL_CLASS = auto_class

    def get_model_info(self) -> dict[str, Any]:
        described = describe(self.model)
        return {**super().get_model_info(), "posenc": described.to_dict() if described else None}


def main(argv: list[str] | None = None) -> int:
    """lm-eval's command line with the `hf-posenc` model type and the offline tasks available.

    Args:
        argv: lm-eval arguments (default: `sys.argv[1:]`); `--include_path` defaults to `LM_EVAL_TASK_DIR`.
    Returns:
        The exit status: 0, or 2 after a one-line message for a `PosEncError`.
    """
    from lm_eval.__main__ import cli_evaluate

    argv = list(sys.argv[1:] if argv is None else argv)
    if not any(a == "--include_path" or a.startswith("--include_path=") for a in argv):
        argv += ["--include_path", str(LM_EVAL_TASK_DIR)]
    saved = sys.argv
    sys.argv = ["hf-posenc lm-eval", *argv]
    try:
        cli_evaluate()
    except PosEncError as err:
        print(f"hf-posenc lm-eval: error: {err}", file=sys.stderr)
        return 2
    finally:
        sys.argv = saved
    return 0


if __name__ == "__main__":
    sys.exit(main())
