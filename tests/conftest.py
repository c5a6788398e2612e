"""Shared fixtures: tiny random models built from configs (no downloads) and the offline switch."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from pathlib import Path
from typing import Iterator

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest
import torch
import transformers
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from hf_posenc.self_check import verdicts
from hf_posenc.tiny import build

# Self-check verdicts of this run stay in this run: a test that simulates a broken release must not leave a kept
# FAIL for the next run (or the user's own cache) to find. Each test of test_self_check.py has a folder of its own.
# The workers of one xdist run share one folder (a check one worker ran is not run again by the other).
_RUN = os.environ.get("PYTEST_XDIST_TESTRUNUID")
SESSION_VERDICTS = (Path(tempfile.gettempdir()) / f"hf-posenc-verdicts-{_RUN}" if _RUN else
                    Path(tempfile.mkdtemp(prefix="hf-posenc-verdicts-")))
verdicts.directory = lambda: SESSION_VERDICTS

TINY = dict(hidden=64, heads=4, layers=2, vocab=128, positions=64)

# model_type -> (config class, model class for causal LM or encoder, kwargs)
TINY_CONFIGS = {
    "gpt2": lambda: transformers.GPT2Config(
        n_embd=TINY["hidden"], n_head=TINY["heads"], n_layer=TINY["layers"], vocab_size=TINY["vocab"],
        n_positions=TINY["positions"], bos_token_id=0, eos_token_id=0, pad_token_id=0,
    ),
    "llama": lambda: transformers.LlamaConfig(
        hidden_size=TINY["hidden"], num_attention_heads=TINY["heads"], num_key_value_heads=2,
        num_hidden_layers=TINY["layers"], intermediate_size=128, vocab_size=TINY["vocab"],
        max_position_embeddings=TINY["positions"], bos_token_id=0, eos_token_id=0, pad_token_id=0,
    ),
    "mistral": lambda: transformers.MistralConfig(
        hidden_size=TINY["hidden"], num_attention_heads=TINY["heads"], num_key_value_heads=2,
        num_hidden_layers=TINY["layers"], intermediate_size=128, vocab_size=TINY["vocab"],
        max_position_embeddings=TINY["positions"], sliding_window=None, pad_token_id=0,
    ),
    "qwen2": lambda: transformers.Qwen2Config(
        hidden_size=TINY["hidden"], num_attention_heads=TINY["heads"], num_key_value_heads=2,
        num_hidden_layers=TINY["layers"], intermediate_size=128, vocab_size=TINY["vocab"],
        max_position_embeddings=TINY["positions"], pad_token_id=0,
    ),
    "qwen3": lambda: transformers.Qwen3Config(
        hidden_size=TINY["hidden"], num_attention_heads=TINY["heads"], num_key_value_heads=2, head_dim=16,
        num_hidden_layers=TINY["layers"], intermediate_size=128, vocab_size=TINY["vocab"],
        max_position_embeddings=TINY["positions"], pad_token_id=0,
    ),
    "bert": lambda: transformers.BertConfig(
        hidden_size=TINY["hidden"], num_attention_heads=TINY["heads"], num_hidden_layers=TINY["layers"],
        intermediate_size=128, vocab_size=TINY["vocab"], max_position_embeddings=TINY["positions"], pad_token_id=0,
    ),
    "roberta": lambda: transformers.RobertaConfig(
        hidden_size=TINY["hidden"], num_attention_heads=TINY["heads"], num_hidden_layers=TINY["layers"],
        intermediate_size=128, vocab_size=TINY["vocab"], max_position_embeddings=TINY["positions"] + 2,
        pad_token_id=1,
    ),
    "distilbert": lambda: transformers.DistilBertConfig(
        dim=TINY["hidden"], n_heads=TINY["heads"], n_layers=TINY["layers"], hidden_dim=128,
        vocab_size=TINY["vocab"], max_position_embeddings=TINY["positions"], pad_token_id=0,
    ),
}
CAUSAL = {"gpt2", "llama", "mistral", "qwen2", "qwen3"}
ENCODERS = {"bert", "roberta", "distilbert"}


# Large enough weights that positions change logits by O(1), so a no-op patch cannot pass a test.
NO_DROPOUT = dict(initializer_range=0.2, attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0, hidden_dropout_prob=0.0,
                  attention_probs_dropout_prob=0.0, dropout=0.0, attention_dropout=0.0, qa_dropout=0.0,
                  seq_classif_dropout=0.0)


def tiny_model(model_type: str, attn: str = "sdpa", seed: int = 0, head: str | None = None,
               dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A tiny random model of `model_type` (`hf_posenc.tiny.build`) in eval mode, with the peaky weights of
    NO_DROPOUT: causal LM for decoders, MaskedLM for encoders, or the `head` named."""
    config = TINY_CONFIGS[model_type]()
    for key, value in NO_DROPOUT.items():
        if hasattr(config, key):
            setattr(config, key, value)
    config._attn_implementation = attn
    if head is None:
        head = "causal" if model_type in CAUSAL else "masked"
    cls = {"causal": transformers.AutoModelForCausalLM, "masked": transformers.AutoModelForMaskedLM,
           "base": transformers.AutoModel, "cls": transformers.AutoModelForSequenceClassification}[head]
    return build(config, cls, seed, attn, dtype)


@pytest.fixture
def self_check_forced(monkeypatch: pytest.MonkeyPatch) -> None:
    """The release self-check forced on (HF_POSENC_SELF_CHECK=always): the invariant and contract matrices run it on
    the tested release too, so it is exercised on every kind of model they patch before a release day needs it."""
    monkeypatch.setenv("HF_POSENC_SELF_CHECK", "always")


@pytest.fixture
def make_tiny():
    return tiny_model


BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@contextlib.contextmanager
def benchmark_scripts(folder: str) -> Iterator[None]:
    """Import `benchmarks/<folder>`'s scripts by their plain names (as they import each other), then put
    sys.path and sys.modules back. benchmarks/study and benchmarks/lengthgen both have run, settings and arms,
    and each run.py puts its own folder first on sys.path: without this, a worker's `import run` answered with
    whichever study a previous test had imported."""
    names = {script.stem for script in BENCHMARKS.glob("*/*.py")}
    saved_path = list(sys.path)
    saved = {name: sys.modules.pop(name) for name in names if name in sys.modules}
    sys.path.insert(0, str(BENCHMARKS / folder))
    try:
        yield
    finally:
        sys.path[:] = saved_path
        for name in names:
            sys.modules.pop(name, None)
        sys.modules.update(saved)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--attention-backend", default=None, choices=("dense", "chunked"),
                     help="run posenc_sdpa on this backend for every call (chunked: 4-row query blocks, so "
                          "short inputs cross several blocks); test_fast_attention runs the matrix this way")


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):  # `make test` runs one worker per core: one torch thread each
        torch.set_num_threads(1)
    backend = config.getoption("--attention-backend")
    if backend is not None:
        from hf_posenc import attention
        from hf_posenc.fast_attention import backends

        attention.SETTINGS["backend"] = attention.check_backend(backend)
        backends.CHUNK_ELEMENTS, backends.MIN_CHUNK = 64, 4


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the classes whose weights were loaded: transformers' own from_pretrained, counted."""
    calls: list[str] = []
    original = transformers.PreTrainedModel.from_pretrained.__func__

    def counted(cls, *args, **kwargs):
        calls.append(cls.__name__)
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", classmethod(counted))
    return calls


class DeviceWithoutFloat64(TorchDispatchMode):
    """The meta device standing in for an accelerator without float64 (Apple MPS): records every float64 tensor
    created there (`created`); a copy from it to the CPU gives zeros of the shape and dtype asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.created: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        source = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if func is torch.ops.aten._to_copy.default and source is not None and source.is_meta \
                and kwargs.get("device") == torch.device("cpu"):
            return torch.zeros(source.shape, dtype=kwargs.get("dtype") or source.dtype)
        out = func(*args, **kwargs)
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor) and tensor.is_meta and tensor.dtype == torch.float64:
                self.created.append(str(func))
        return out
