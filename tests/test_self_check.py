"""The release self-check and `hf-posenc doctor`: a transformers release that breaks a patch is refused by name,
before the user's model is touched, instead of returning a model whose numbers are wrong.

The break is simulated the way 5.24 broke the package: a cached forward loses the positions of the tokens the
cache holds (here transformers' own DynamicCache reports an empty cache, so every step restarts at 0)."""

from __future__ import annotations

import copy
import json
import logging
import os
import subprocess
import sys

import pytest
import torch
import transformers
from packaging.version import Version
from transformers.cache_utils import DynamicCache

import hf_posenc as hp
from hf_posenc import cli, compat, self_check
from hf_posenc.compat import loading as compat_loading
from hf_posenc.patching import release_check
from hf_posenc.catalog import list_architectures
from hf_posenc.self_check import verdicts
from hf_posenc.tiny import tiny_config

from conftest import tiny_model


@pytest.fixture(autouse=True)
def fresh_reports(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """Each test starts as a new machine would: no class checked yet, in this process or on disk."""
    monkeypatch.setattr(self_check, "_REPORTS", {})
    monkeypatch.setattr(verdicts, "directory", lambda: tmp_path / "verdicts")


@pytest.fixture
def untested_release(monkeypatch: pytest.MonkeyPatch) -> None:
    """The installed transformers is past the newest tested one (auto mode then checks)."""
    monkeypatch.delenv(self_check.ENV, raising=False)
    monkeypatch.setattr(compat, "TESTED_THROUGH", "5.0.0")


@pytest.fixture
def broken_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers as a release that loses the cached positions would behave."""
    monkeypatch.setattr(DynamicCache, "get_seq_length", lambda self, layer_idx=0: 0)


def logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


def cached_vs_uncached(model: torch.nn.Module, ids: torch.Tensor) -> float:
    with torch.no_grad():
        full = model(ids).logits
        first = model(ids[:, :6], use_cache=True)
        step = model(ids[:, 6:7], **{compat.cache_kwarg(model): compat.cache_out(first)}, use_cache=True).logits
    return float((step[:, -1] - full[:, 6]).abs().max())


def test_auto_mode_checks_only_past_the_tested_release(monkeypatch):
    monkeypatch.delenv(self_check.ENV, raising=False)
    assert self_check.wanted() == self_check.untested()  # .venv runs TESTED_THROUGH; a release-check venv newer
    assert self_check.untested("99.0.0") and not self_check.untested(compat.TESTED_THROUGH)
    monkeypatch.setattr(compat, "TESTED_THROUGH", "5.0.0")
    assert self_check.wanted() == self_check.untested()
    monkeypatch.setenv(self_check.ENV, "never")
    assert not self_check.wanted()
    monkeypatch.setenv(self_check.ENV, "always")
    assert self_check.wanted()


def test_a_mode_that_is_not_one_is_named(monkeypatch):
    monkeypatch.setenv(self_check.ENV, "sometimes")
    with pytest.raises(hp.PosEncError, match="HF_POSENC_SELF_CHECK='sometimes' is not a mode; allowed: auto, always, never"):
        hp.patch(tiny_model("llama"), "alibi")


@pytest.mark.parametrize("model_type,scheme", [("llama", "alibi"), ("gpt2", "rope"), ("bert", "alibi"),
                                               ("qwen3", "yarn")])
def test_forced_check_passes_here_and_says_so_once(monkeypatch, caplog, model_type, scheme):
    monkeypatch.setenv(self_check.ENV, "always")
    runs: list[str] = []
    real_run = self_check.run
    monkeypatch.setattr(self_check, "run", lambda *a, **k: runs.append(a[2].scheme) or real_run(*a, **k))
    options = {"factor": 4.0} if scheme == "yarn" else {}
    with caplog.at_level(logging.WARNING, logger="hf_posenc"):
        hp.patch(tiny_model(model_type), scheme, **options)
        hp.patch(tiny_model(model_type, seed=1), scheme, **options)  # same class: checked once per process
    assert runs == [scheme]
    lines = [r.getMessage() for r in caplog.records if "self-check" in r.getMessage()]
    assert len(lines) == 1 and "passed" in lines[0], lines
    report = next(iter(self_check._REPORTS.values()))
    assert report.passed and {c.name for c in report.checks} >= {"own == stock", "unpatch exact", "padded == alone"}
    assert ("cached == uncached" in {c.name for c in report.checks}) == (model_type != "bert")


def test_an_untested_release_that_passes_says_it_is_untested(untested_release, caplog):
    with caplog.at_level(logging.WARNING, logger="hf_posenc"):
        hp.patch(tiny_model("gpt2"), "alibi")
    (line,) = [r.getMessage() for r in caplog.records if "self-check" in r.getMessage()]
    assert f"transformers {transformers.__version__} is newer than 5.0.0" in line and "passed" in line


def test_the_check_catches_a_release_that_loses_cached_positions(untested_release, broken_cache):
    """Without the check the patch goes through and cached logits are wrong; with it, a refusal by name."""
    ids = torch.randint(3, 120, (1, 8), generator=torch.Generator().manual_seed(0))
    model = tiny_model("llama")
    with pytest.MonkeyPatch.context() as never:
        never.setenv(self_check.ENV, "never")
        hp.patch(model, "alibi")
    assert cached_vs_uncached(model, ids) > 0.1  # what the user would have got: a silently wrong model

    model = tiny_model("llama")
    with pytest.MonkeyPatch.context() as never:
        never.setenv(self_check.ENV, "never")
        hp.patch(model, "learned", init="normal")  # a previous patch with weights of its own
    before = {k: v.clone() for k, v in model.state_dict().items()}
    described, out = hp.describe(model), logits(model, ids)
    with pytest.raises(hp.PosEncError) as err:
        hp.patch(model, "alibi")
    message = str(err.value)
    for part in (f"transformers {transformers.__version__} breaks hf-posenc's 'alibi' patch of LlamaForCausalLM",
                 "cached == uncached", "apart", "the newest transformers tested is 5.0.0",
                 "pip install 'transformers==5.0.0'", "HF_POSENC_SELF_CHECK=never", "The model was not changed"):
        assert part in message, (part, message)
    assert hp.describe(model) == described
    assert model.state_dict().keys() == before.keys()
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert torch.equal(logits(model, ids), out)


def test_a_refused_release_stays_refused_for_that_class(untested_release, broken_cache):
    for _ in range(2):
        with pytest.raises(hp.PosEncError, match="self-check: cached == uncached"):
            hp.patch(tiny_model("gpt2"), "rope")


def test_the_check_runs_on_a_tiny_model_not_the_users(monkeypatch):
    """The user's model is only read: a deep copy taken before equals it after, weights and config alike."""
    monkeypatch.setenv(self_check.ENV, "always")
    model = tiny_model("qwen2")
    twin = copy.deepcopy(model)
    report = release_check(type(model), "qwen2", hp.PosEncConfig("alibi"))
    assert report.passed, report.failures()
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), twin.state_dict().values()))
    assert not hasattr(model.config, "posenc")


def test_options_sized_for_the_real_model_fall_back_on_the_tiny_one(monkeypatch):
    """LongRoPE lists of the real head_dim/2 do not fit the tiny model: it is checked with its own."""
    monkeypatch.setenv(self_check.ENV, "always")
    model = tiny_model("llama")  # head_dim 16: 8 pairs
    pairs = 8
    hp.patch(model, "longrope", factor=2.0, short_factor=[1.0] * pairs, long_factor=[2.0] * pairs)
    assert next(iter(self_check._REPORTS.values())).passed


def test_doctor_passes_here_with_every_family_and_the_versions(capsys):
    assert cli.main(["doctor", "--schemes", "nope"]) == 0
    out = capsys.readouterr().out
    for name in ("torch", "transformers", "peft", "accelerate"):
        assert f"\n{name}: " in f"\n{out}"
    # (": OUTSIDE" follows in a release-check venv of a newer transformers)
    assert f"transformers: {transformers.__version__} (tested {compat.MIN_TRANSFORMERS} .. {compat.TESTED_THROUGH}" in out
    rows = [line.split(" | ")[0].lstrip("| ") for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    assert set(rows) - {"model type"} == set(self_check.families())
    assert set(list_architectures()) <= set(rows)
    assert out.rstrip().splitlines()[-1].startswith("verdict: OK: ")  # one line says it all


def test_doctor_fails_with_exit_1_under_the_simulated_break(broken_cache, capsys):
    assert cli.main(["doctor", "--model-types", "llama", "t5", "--schemes", "alibi"]) == 1
    out = capsys.readouterr().out
    assert "| llama | LlamaForCausalLM | alibi | FAIL |" in out and "cached == uncached" in out
    assert out.rstrip().splitlines()[-1].startswith("verdict: NOT OK: ") and "llama/alibi" in out


def test_doctor_refuses_unknown_names_before_running(capsys):
    assert cli.main(["doctor", "--schemes", "alibii"]) == 2
    assert cli.main(["doctor", "--model-types", "lama"]) == 2
    err = capsys.readouterr().err
    assert "unknown scheme 'alibii'" in err and "unknown model type(s) 'lama'" in err


def test_a_peft_wrapped_model_is_checked_by_its_transformers_class(monkeypatch):
    import peft

    monkeypatch.setenv(self_check.ENV, "always")
    model = peft.get_peft_model(tiny_model("llama"), peft.LoraConfig(target_modules=["q_proj"]))
    hp.patch(model, "alibi")
    assert hp.describe(model).scheme == "alibi"
    assert [k[0] for k in self_check._REPORTS] == [transformers.LlamaForCausalLM]


def test_a_class_the_check_cannot_build_is_patched_and_says_it_was_not_checked(untested_release, caplog):
    """No tiny copy of the class can be built (its config names no known model type): the check cannot run, which
    says nothing against the patch -- it goes ahead, and the log says it was not checked."""
    model = tiny_model("gpt2")
    model.config.model_type = "my_own_gpt2"
    with caplog.at_level(logging.WARNING, logger="hf_posenc"):
        hp.patch(model, "alibi")
    assert hp.describe(model).scheme == "alibi"
    (line,) = [r.getMessage() for r in caplog.records if "self-check" in r.getMessage()]
    assert "self-check of GPT2LMHeadModel with 'alibi' could not run" in line and "patching unchecked" in line


# Every kind of model hf-posenc patches: bare models, each head the adapters list, encoder-decoders (with a pooled
# head too), heads whose tiny config has no pad token (Llama's sequence classifier), with the scheme of each site.
KINDS = [("llama", "AutoModel"), ("qwen2", "AutoModel"), ("gpt2", "AutoModel"), ("bert", "AutoModel"),
         ("llama", "AutoModelForCausalLM"), ("llama", "AutoModelForSequenceClassification"),
         ("gpt2", "AutoModelForSequenceClassification"), ("bert", "AutoModelForMaskedLM"),
         ("bert", "AutoModelForSequenceClassification"), ("bert", "AutoModelForTokenClassification"),
         ("bert", "AutoModelForQuestionAnswering"), ("bert", "AutoModelForMultipleChoice"),
         ("t5", "AutoModelForSeq2SeqLM"), ("bart", "AutoModelForSeq2SeqLM"), ("bart", "AutoModelForSequenceClassification")]


@pytest.mark.parametrize("scheme", ["alibi", "rope", "nope"])
@pytest.mark.parametrize("model_type,auto", KINDS, ids=[f"{t}-{a}" for t, a in KINDS])
def test_every_kind_of_model_passes_the_forced_check(monkeypatch, model_type, auto, scheme):
    monkeypatch.setenv(self_check.ENV, "always")
    model_class = getattr(transformers, auto)._model_mapping[type(tiny_config(model_type))]
    report = release_check(model_class, model_type, self_check.check_config(scheme))
    assert report.status in ("pass", "skipped"), (report.status, report.failures(), report.unchecked)
    if report.status == "pass":
        names = {c.name for c in report.checks}
        assert {"own == stock", "padded == alone", "unpatch exact"} <= names
        assert ("saved, reloaded" in names) == (auto != "AutoModelForMultipleChoice")  # no remote class for it


def test_a_class_no_auto_class_builds_is_checked_without_a_reload(monkeypatch):
    """GPT-2's double-heads model: no Auto class builds it, so a folder of it reloads as another class; the forward
    checks run, the reload ones do not (and do not refuse a correct patch)."""
    monkeypatch.setenv(self_check.ENV, "always")
    report = release_check(transformers.GPT2DoubleHeadsModel, "gpt2", self_check.check_config("alibi"))
    assert report.passed and {"cached == uncached", "padded == alone"} <= {c.name for c in report.checks}
    assert not any(c.name.startswith("saved, reloaded") for c in report.checks)


def test_a_peft_wrapped_bare_model_without_a_pad_token_patches_under_the_forced_check(monkeypatch):
    import peft

    monkeypatch.setenv(self_check.ENV, "always")
    config = tiny_config("llama")
    assert config.pad_token_id is None
    model = peft.get_peft_model(transformers.LlamaForSequenceClassification(config), peft.LoraConfig(
        target_modules=["q_proj"], task_type="SEQ_CLS"))
    hp.patch(model, "alibi")
    assert hp.describe(model).scheme == "alibi"
    assert self_check._REPORTS[(transformers.LlamaForSequenceClassification, "alibi")].passed


def test_the_check_leaves_every_random_state_as_it_was(monkeypatch):
    """A seeded script draws the same numbers after a checked patch as after an unchecked one."""
    import random

    import numpy as np

    def draws(check: str) -> tuple[list[float], float, float]:
        monkeypatch.setenv(self_check.ENV, check)
        monkeypatch.setattr(self_check, "_REPORTS", {})
        model = tiny_model("llama")
        torch.manual_seed(0), np.random.seed(0), random.seed(0)
        hp.patch(model, "alibi")
        return torch.rand(3).tolist(), float(np.random.rand()), random.random()

    checked = draws("always")
    assert self_check._REPORTS  # the check ran
    assert checked == draws("never")


def test_a_verdict_is_kept_on_disk_and_the_next_process_does_not_check_again(monkeypatch):
    monkeypatch.setenv(self_check.ENV, "always")
    hp.patch(tiny_model("gpt2"), "alibi")
    (kept,) = verdicts.directory().glob("*.json")
    monkeypatch.setattr(self_check, "_REPORTS", {})  # a new process
    monkeypatch.setattr(self_check, "run", lambda *a, **k: pytest.fail("checked again"))
    hp.patch(tiny_model("gpt2"), "alibi")
    assert self_check._REPORTS[(transformers.GPT2LMHeadModel, "alibi")].passed
    assert verdicts.load(verdicts.key(transformers.GPT2LMHeadModel, "alibi"), self_check.Report.from_dict).passed
    assert verdicts.key(transformers.GPT2LMHeadModel, "alibi")["hf_posenc"].startswith(hp.__version__ + "+")


@pytest.mark.parametrize("damage", ["cut short", "not json", "another key", "a failure of another stack"])
def test_a_damaged_verdict_is_ignored_and_checked_again(monkeypatch, damage):
    monkeypatch.setenv(self_check.ENV, "always")
    key = verdicts.key(transformers.GPT2LMHeadModel, "alibi")
    path = verdicts.path_for(key)
    path.parent.mkdir(parents=True)
    failed = {"model_class": "GPT2LMHeadModel", "scheme": "alibi", "seconds": 0.1,
              "checks": [{"name": "cached == uncached", "passed": False, "detail": "9 apart"}]}
    path.write_text({"cut short": '{"format": 1, "key": {"transformers": ',
                     "not json": "\x00\x01",
                     "another key": json.dumps({"format": 1, "key": {**key, "scheme": "rope"}, "report": failed}),
                     "a failure of another stack": json.dumps({"format": 1, "key": {**key, "torch": "0.1"},
                                                               "report": failed})}[damage])
    runs = []
    real_run = self_check.run
    monkeypatch.setattr(self_check, "run", lambda *a, **k: runs.append(1) or real_run(*a, **k))
    hp.patch(tiny_model("gpt2"), "alibi")  # not refused by what the damaged file says
    assert runs == [1]
    assert json.loads(path.read_text())["report"]["checks"][0]["passed"]  # replaced by the new verdict


def test_the_second_cli_run_on_an_untested_release_does_not_pay_the_check_again(tmp_path):
    """Two `hf-posenc patch` processes on a transformers past TESTED_THROUGH (forced here): the first runs and keeps
    the check, the second finds it and says nothing."""
    model = tiny_model("gpt2")
    model.save_pretrained(tmp_path / "tiny")
    env = {**os.environ, self_check.ENV: "always", "HF_POSENC_CACHE": str(tmp_path / "cache")}
    logs = []
    for out in ("a", "b"):
        proc = subprocess.run([sys.executable, "-m", "hf_posenc.cli", "patch", str(tmp_path / "tiny"), "alibi", "--out",
                               str(tmp_path / out)], capture_output=True, text=True, env=env, timeout=600)
        assert proc.returncode == 0, proc.stderr
        logs.append(proc.stderr)
    assert "self-check of GPT2LMHeadModel with 'alibi' passed" in logs[0]
    assert "self-check" not in logs[1], logs[1]
    assert len(list((tmp_path / "cache" / verdicts.SUBDIR).glob("*.json"))) >= 1


@pytest.mark.skipif(Version(transformers.__version__) < Version("5.25.0"),
                    reason="the Auto classes hand remote code `_from_auto` from 5.25 on")
def test_the_check_catches_a_load_path_break_the_forward_pass_cannot_see(untested_release, monkeypatch):
    """5.25's Auto classes hand remote code a `_from_auto` that the Auto class it calls adds again. Without the
    loader's fix that was the only break: every forward-pass check passed and doctor said OK. The reload checks
    refuse it by name."""
    monkeypatch.setattr(compat_loading, "REMOTE_HANDOFF_KWARGS", ("trust_remote_code",))
    with pytest.raises(hp.PosEncError, match="saved, reloaded: TypeError: .*multiple values for keyword argument "
                                             "'_from_auto'"):
        hp.patch(tiny_model("llama"), "alibi")
    monkeypatch.setattr(self_check, "_REPORTS", {})
    assert cli.main(["doctor", "--model-types", "llama", "--schemes", "nope"]) == 1
