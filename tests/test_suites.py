"""Evaluation suites are plug-ins: a suite written in one file of its own shows up in `hf-posenc eval --help`
(through `--suite-module` or an installed package's entry point), runs on a tiny model, and lands in
results.json, the comparison table, the model card and a plot, like a built-in one. Each command runs in a
fresh interpreter: a registered suite lasts for the process and would leak into the registry other tests read."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from test_evaluation import saved_tiny  # noqa: F401  (fixture)

import hf_posenc as hp
from hf_posenc import evaluation, results
from hf_posenc.errors import PosEncError
from hf_posenc.evaluation.suite import SUITES

ECHO = '''
"""`echo`: how often the greedy next token is the prompt's first token, on random prompts (a throwaway suite)."""
import dataclasses

from hf_posenc.domains import at_least, option
from hf_posenc.evaluation.suite import Metric, Suite, register_suite
from hf_posenc.results import Plot


@dataclasses.dataclass(frozen=True)
class EchoSettings:
    """echo: the first token recalled"""

    trials: int = option(3, "random prompts per length", at_least(1, int))  # the same field name as passkey's


def _dataset(key, settings):
    return {"dataset_type": "echo", "dataset_name": "Echo prompts (throwaway)"}


class Echo(Suite):
    name = "echo"
    help = "first token recalled after a random prompt"
    Settings = EchoSettings
    metrics = {"echo": Metric(("recall",), "tokens", "recall", task=("text-generation", "Echo recall"),
                              dataset=_dataset, plot=Plot("echo.png", "lines", "Echo", "context length (tokens)",
                                                          "recall", log_x=True))}
    measured_by = ("trials", "seed")

    def cells(self, scoring, settings, argument):
        import torch

        from hf_posenc.stats import rate_fields

        for length in scoring.lengths:
            generator = torch.Generator().manual_seed(scoring.seed + length)
            ids = torch.randint(3, scoring.model.config.vocab_size, (settings.trials, length), generator=generator)
            with torch.no_grad():
                hits = int((scoring.model(input_ids=ids).logits[:, -1].argmax(-1) == ids[:, 0]).sum())
            yield "echo", length, {"recall": hits / len(ids), **rate_fields(hits, len(ids))}


register_suite(Echo())
'''


def hf_posenc_cli(*argv: str, path: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(path or ""), os.environ.get("PYTHONPATH", "")]))}
    return subprocess.run([sys.executable, "-m", "hf_posenc.cli", *argv], env=env, capture_output=True, text=True,
                          timeout=600)


def recall(model: torch.nn.Module, length: int, trials: int, seed: int = 0) -> tuple[int, int]:
    """The echo suite's count, computed here on its own: (hits, prompts)."""
    ids = torch.randint(3, model.config.vocab_size, (trials, length), generator=torch.Generator().manual_seed(seed + length))
    with torch.no_grad():
        return int((model(input_ids=ids).logits[:, -1].argmax(-1) == ids[:, 0]).sum()), trials


def test_a_suite_in_one_file_is_listed_run_recorded_compared_carded_and_plotted(saved_tiny, tmp_path):  # noqa: F811
    suite_file = tmp_path / "plugins" / "echo_suite.py"
    suite_file.parent.mkdir()
    suite_file.write_text(ECHO, encoding="utf-8")
    folder, out = saved_tiny("llama"), tmp_path / "yarn"

    # listed: by --suite-module, and by an installed package's entry point (a dist-info on the path)
    shown = hf_posenc_cli("eval", "--suite-module", str(suite_file), "--help")
    dist = tmp_path / "plugins" / "echo_suite-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: echo-suite\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[hf_posenc.suites]\necho = echo_suite\n")
    installed = hf_posenc_cli("eval", "--help", path=suite_file.parent)
    for help_text in (shown, installed):
        assert help_text.returncode == 0, help_text.stderr
        text = " ".join(help_text.stdout.split())
        assert "suite echo (--echo.*): echo: the first token recalled --echo.trials TRIALS random prompts" in text
        assert "suites, from: perplexity (ppl): perplexity by context length; passkey: " in text
        assert "; echo: first token recalled after a random prompt --suite-module" in text
    assert "echo" not in hf_posenc_cli("eval", "--help").stdout  # nothing leaks into a run without it

    # a bad value of its own flag is refused like a built-in's, before anything is written
    refused = hf_posenc_cli("eval", "--suite-module", str(suite_file), "--model", folder, "--suite", "echo",
                            "--echo.trials", "0", "--out", str(out))
    assert refused.returncode == 2 and "--echo.trials must be an integer >= 1, got 0" in refused.stderr
    assert not out.exists()

    # runs, beside a built-in suite, on the patched model and the unpatched baseline
    ran = hf_posenc_cli("eval", "--suite-module", str(suite_file), "--model", folder, "--patch", "yarn", "--opt",
                        "factor=2", "--suite", "echo,ppl", "--lengths", "16,32", "--echo.trials", "6",
                        "--perplexity.max-windows", "1", "--out", str(out))
    assert ran.returncode == 0, ran.stderr
    assert "| echo recall @ 16 tokens |" in ran.stdout
    record = results.load(out / "results.json")
    assert record.complete and record.settings["suite"] == ["echo", "perplexity"]
    assert record.suites["echo"].settings["trials"] == 6 and record.suites["echo"].measured["trials"] == 6
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    expected = {"llama (unpatched)": model}
    patched = hp.patch(transformers.AutoModelForCausalLM.from_pretrained(folder).eval(), "yarn", factor=2.0)
    expected[record.runs[0].label] = patched
    assert [run.label for run in record.runs] == [*expected][::-1]
    for run in record.runs:
        for length in (16, 32):
            hits, n = recall(expected[run.label], length, 6)
            cell = run.metrics["echo"][str(length)]
            assert cell["recall"] == hits / n and cell["n"] == n and cell["low"] <= cell["recall"] <= cell["high"]
        assert set(run.metrics["perplexity"]) == {"16", "32"}
    assert (out / "echo.png").stat().st_size > 1000 and (out / "perplexity.png").is_file()

    # the comparison table, with the rate's interval, and its plot
    compared = hf_posenc_cli("eval", "--suite-module", str(suite_file), "--compare", str(out / "results.json"),
                             "--out", str(tmp_path / "cmp"))
    assert compared.returncode == 0, compared.stderr
    table = (tmp_path / "cmp" / "compare.md").read_text()
    cell = record.runs[0].metrics["echo"]["32"]
    assert (f"| {record.runs[0].label} | echo recall @ 32 tokens | "
            f"{results.format_rate(cell['recall'], 6, cell['low'], cell['high'])} |") in table
    assert "echo recall @ 16 tokens: " in table  # the interval notes of the two runs
    assert (tmp_path / "cmp" / "echo.png").stat().st_size > 1000

    # another run with another setting of its own, then the plug-in uninstalled: its file and its dist-info gone
    other = tmp_path / "fewer"
    assert hf_posenc_cli("eval", "--suite-module", str(suite_file), "--model", folder, "--suite", "echo", "--lengths",
                         "16,32", "--echo.trials", "3", "--no-baseline", "--out", str(other)).returncode == 0
    suite_file.unlink()
    (dist / "METADATA").unlink()
    (dist / "entry_points.txt").unlink()

    # the model card: its table row, its model-index entry (task, dataset and unit from the file), its plot
    carded = hf_posenc_cli("card", str(out))
    assert carded.returncode == 0, carded.stderr
    card = (out / "README.md").read_text()
    for piece in ["name: echo recall @ 16 tokens", "name: Echo recall", "type: echo", "Echo prompts (throwaway)",
                  "| echo recall | 32 tokens |", "![echo.png](echo.png)"]:
        assert piece in card, piece

    # the comparison refuses files whose echo settings differ, naming the setting, as it would with the suite here
    refused = hf_posenc_cli("eval", "--compare", str(out / "results.json"), str(other / "results.json"),
                            "--out", str(tmp_path / "cmp2"))
    assert refused.returncode == 2 and "echo.trials" in refused.stderr, refused.stderr

    # read here, where the suite is not imported, the file still prints every table with its unit and interval
    assert "echo" not in SUITES
    loaded = evaluation.load_results(out / "results.json")
    assert (f"| {record.runs[0].label} | echo recall @ 32 tokens | "
            f"{results.format_rate(cell['recall'], 6, cell['low'], cell['high'])} |") in results.markdown(
        loaded.runs, loaded.tables())
    assert loaded.suites["echo"].tables["echo"].higher_is_better == {"recall": True}


BROKEN = {"raises.py": "raise RuntimeError('no such backend')\n",
          "clashes.py": ECHO.replace('name = "echo"', 'name = "passkey"')}


def test_a_broken_or_clashing_plug_in_is_skipped_by_name_and_the_built_in_suites_run(saved_tiny, tmp_path):  # noqa: F811
    for name, text in BROKEN.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    flags = [item for name in BROKEN for item in ("--suite-module", str(tmp_path / name))]
    ran = hf_posenc_cli("eval", *flags, "--model", saved_tiny("llama"), "--suite", "ppl", "--lengths", "16",
                        "--perplexity.max-windows", "1", "--no-baseline", "--out", str(tmp_path / "out"))
    assert ran.returncode == 0, ran.stderr
    assert f"suite module {tmp_path / 'raises.py'} skipped: RuntimeError: no such backend" in ran.stderr
    assert f"suite module {tmp_path / 'clashes.py'} skipped: ValueError: suite 'passkey' is already registered" \
        in ran.stderr
    assert "| perplexity @ 16 tokens |" in ran.stdout


def test_settings_the_registered_suites_do_not_take_are_refused():
    with pytest.raises(PosEncError, match="unknown suite settings group 'echo'; the registered suites' groups are "
                                          "perplexity, passkey, "):
        evaluation.SuiteSettings(["ppl"], [16], echo={"trials": 3})
    with pytest.raises(PosEncError, match="unknown perplexity settings max_window; perplexity takes text, "):
        evaluation.SuiteSettings(["ppl"], [16], perplexity={"max_window": 1})


# a second throwaway suite whose setting has the same name as echo's (and passkey's): `trials`
PARROT = ECHO.replace('name = "echo"', 'name = "parrot"').replace('{"echo": Metric', '{"parrot": Metric').replace(
    'Plot("echo.png"', 'Plot("parrot.png"').replace('yield "echo"', 'yield "parrot"').replace(
    "EchoSettings", "ParrotSettings").replace('"""echo: the first token recalled"""', '"""parrot: echo again"""')


def test_two_plug_ins_may_name_a_setting_alike(saved_tiny, tmp_path):  # noqa: F811
    """Each suite's flags live in its own group (`--echo.trials`, `--parrot.trials`, `--passkey.trials`): two
    plug-ins written apart, and a built-in, name a field `trials` and each gets its own value."""
    for name, text in (("echo_suite.py", ECHO), ("parrot_suite.py", PARROT)):
        (tmp_path / name).write_text(text, encoding="utf-8")
    out = tmp_path / "out"
    ran = hf_posenc_cli("eval", "--suite-module", str(tmp_path / "echo_suite.py"), "--suite-module",
                        str(tmp_path / "parrot_suite.py"), "--model", saved_tiny("llama"), "--suite",
                        "echo,parrot,passkey", "--lengths", "16", "--echo.trials", "2", "--parrot.trials", "5",
                        "--passkey.trials", "1", "--passkey.depths", "0.5", "--no-baseline", "--out", str(out))
    assert ran.returncode == 0, ran.stderr
    assert "suite module" not in ran.stderr  # neither plug-in skipped
    record = results.load(out / "results.json")
    assert {name: record.suites[name].settings["trials"] for name in ("echo", "parrot", "passkey")} == \
        {"echo": 2, "parrot": 5, "passkey": 1}
    assert record.runs[0].metrics["echo"]["16"]["n"] == 2 and record.runs[0].metrics["parrot"]["16"]["n"] == 5


def test_any_lm_eval_task_runs_as_one_suite_with_the_numbers_lm_eval_gives(tmp_path):
    """`lm_eval:<task>` runs lm-eval's own evaluation on the in-memory patched model: the same accuracy as
    lm-eval's command-line route (the `hf-posenc` model type patching on load), with n and a Wilson interval."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    from hf_posenc.integrations import lm_eval as integration
    from integration_support import char_tokenizer, save_tiny

    folder = save_tiny(tmp_path / "tiny")
    model = hp.patch(transformers.AutoModelForCausalLM.from_pretrained(folder).eval(), "alibi")
    settings = evaluation.SuiteSettings(["lm_eval:posenc_sentiment"], [64], name="tiny", scheme="alibi",
                                        lm_eval={"lm_eval_limit": 12})
    record = evaluation.run_suites(model, char_tokenizer(), settings, tmp_path / "out")
    cell = record.runs[0].metrics["lm_eval"]["posenc_sentiment acc"]
    manager = TaskManager(include_path=str(integration.LM_EVAL_TASK_DIR), include_defaults=False)
    direct = lm_eval.simple_evaluate(model="hf-posenc", model_args=f"pretrained={folder},scheme=alibi,max_length=64",
                                     tasks=["posenc_sentiment"], device="cpu", task_manager=manager, limit=12)
    assert cell["value"] == direct["results"]["posenc_sentiment"]["acc,none"] and cell["n"] == 12
    assert cell["low"] <= cell["value"] <= cell["high"]
    assert "| tiny alibi | lm_eval value @ posenc_sentiment acc | " in results.markdown(record.runs, record.tables())
    with pytest.raises(PosEncError, match="unknown lm-eval task 'posenc_sentimnt' \\(did you mean 'posenc_sentiment'"):
        evaluation.run_suites(model, char_tokenizer(), settings.replace(suites=["lm_eval:posenc_sentimnt"]),
                              tmp_path / "refused")
    assert not (tmp_path / "refused").exists()
