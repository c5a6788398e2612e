"""The recipes ship in the package (issue 31): listed and copied by name, run by name, and present in the wheel a
user installs, so `pip install` alone runs the demo and a recipe from any folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import pytest
from test_train import REPO, tiny_assets

from hf_posenc import cli
from hf_posenc.errors import PosEncError
from hf_posenc.folders import read_marker
from hf_posenc.train import load_recipe
from hf_posenc.train.shipped import SHIPPED, copy_recipe, find, recipe_path, shipped_recipes

YAMLS = sorted((REPO / "recipes").glob("*/*/config_*.yaml"))


def test_the_package_ships_the_repositorys_recipes_as_one_copy():
    assert SHIPPED.resolve() == (REPO / "recipes").resolve()
    assert [r.path.resolve() for r in shipped_recipes()] == [p.resolve() for p in YAMLS] and len(YAMLS) >= 10


@pytest.mark.parametrize("path", YAMLS, ids=[f"{p.parent.parent.name}/{p.parent.name}/{p.stem}" for p in YAMLS])
def test_a_name_loads_the_same_recipe_as_its_path(path):
    name = f"{path.parent.parent.name}/{path.parent.name}/{path.stem.removeprefix('config_')}"
    assert find(name).path.resolve() == path.resolve()
    assert load_recipe(name, ["--max_steps", "3"]) == load_recipe(path, ["--max_steps", "3"])


def test_paths_win_over_names_and_unknown_names_list_the_shipped_ones(tmp_path, monkeypatch):
    own = tmp_path / "smollm2-135m" / "alibi" / "smoke"  # a file of the user's that looks like a name
    own.parent.mkdir(parents=True)
    own.write_text("x")
    monkeypatch.chdir(tmp_path)
    assert recipe_path("smollm2-135m/alibi/smoke") == Path("smollm2-135m/alibi/smoke")
    with pytest.raises(PosEncError, match=r"no shipped recipe 'smollm2-135m/yarn/huge'; shipped: bart-tiny/copy/alibi"):
        load_recipe("smollm2-135m/yarn/huge")


def test_recipes_lists_one_line_each(capsys):
    assert cli.main(["recipes"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(YAMLS)
    smoke = next(line for line in lines if line.startswith("smollm2-135m/alibi/smoke "))
    assert "smollm2 -> alibi; 192 steps, 0.05M tokens. SmolLM2-135M-Instruct: RoPE -> ALiBi" in smoke
    assert cli.main(["recipes", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["name"] for r in rows} == {r.name for r in shipped_recipes()}


def test_an_epoch_based_recipe_is_listed_by_its_epochs(tmp_path):
    """A recipe that trains by epochs (max_steps -1) once listed as "-1 steps, -0.05M tokens"."""
    import yaml

    from hf_posenc.train.shipped import ShippedRecipe

    path = tmp_path / "config_epochs.yaml"
    path.write_text(yaml.safe_dump({**find("smollm2-135m/alibi/smoke").fields(), "max_steps": -1,
                                    "num_train_epochs": 2}))
    row = ShippedRecipe("mine/alibi/epochs", path).summary()
    assert row["steps"] is None and row["epochs"] == 2 and row["tokens"] == 0


def test_copy_writes_an_editable_marked_copy_and_never_over_a_folder(tmp_path, capsys):
    target = tmp_path / "mine"
    assert cli.main(["recipes", "copy", "smollm2-135m/yarn/smoke", str(target)]) == 0
    assert sorted(p.name for p in target.iterdir()) == [".hf-posenc.json", "README.md", "config_smoke.yaml"]
    assert (target / "config_smoke.yaml").read_bytes() == find("smollm2-135m/yarn/smoke").path.read_bytes()
    assert read_marker(target)["command"] == "recipes copy"
    assert load_recipe(target / "config_smoke.yaml").posenc.scheme == "yarn"
    (target / "config_smoke.yaml").write_text("edited")
    for argv in (["recipes", "copy", "smollm2-135m/yarn/smoke", str(target)], ["recipes", "copy", "nosuch/a/b", "x"],
                 ["recipes", "copy", "smollm2-135m/yarn/smoke"], ["recipes", "list", "smollm2-135m/yarn/smoke"]):
        assert cli.main(argv) == 2, argv
    assert (target / "config_smoke.yaml").read_text() == "edited"
    err = capsys.readouterr().err
    assert "already exists and is not an empty folder" in err and "no shipped recipe 'nosuch/a/b'" in err
    with pytest.raises(PosEncError, match="already exists"):
        copy_recipe("smollm2-135m/yarn/smoke", target)


def test_train_runs_a_shipped_recipe_by_name(tmp_path):
    assets = tiny_assets(tmp_path / "assets")
    out = tmp_path / "run"
    argv = ["train", "smollm2-135m/alibi/smoke", "--model_name_or_path", str(assets["model"]), "--dataset_name",
            str(assets["data"]), "--seq_len", "32", "--max_steps", "2", "--save_strategy", "no",
            "--perplexity_lengths", "32", "--output_dir", str(out)]
    assert cli.main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["settings"]["max_steps"] == 2 and results["runs"][-1]["scheme"] == "alibi"
    assert results["settings"]["lora_r"] == 16  # the shipped smoke recipe's own LoRA rank


@pytest.mark.slow
def test_the_installed_wheel_runs_from_a_folder_of_its_own(tmp_path):
    """Build the wheel, check what it holds, install it (not editable) into a new venv whose only hf_posenc is the
    wheel's (its dependencies are this environment's, reached through a path entry: the editable install here is
    not seen), then run the demo, list, copy and train a shipped recipe from a folder outside the repository."""
    start = time.perf_counter()
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels),
                    str(REPO)], check=True, timeout=300)
    (wheel,) = wheels.glob("hf_posenc-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for wanted in ("hf_posenc/recipes/smollm2-135m/README.md", "hf_posenc/recipes/smollm2-135m/alibi/config_smoke.yaml",
                   "hf_posenc/accelerate_configs/cpu_2proc.yaml", "hf_posenc/model_cards/modeling_posenc.py",
                   "hf_posenc/metrics/passkey/passkey.py", "hf_posenc/model_types.json", "hf_posenc/seq2seq_types.json",
                   "hf_posenc/tiny_overrides.json", "hf_posenc/support.json"):
        assert wanted in names, wanted
    assert sum(n.startswith("hf_posenc/recipes/") and n.endswith(".yaml") for n in names) == len(YAMLS)
    assert not any(n.startswith("tests/") for n in names)

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    # PYTHONPATH cleared: pip would take a checkout on it for an installed hf-posenc and install nothing
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True, timeout=300,
                   env={**os.environ, "PYTHONPATH": ""})
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], check=True,
                          capture_output=True, text=True).stdout.strip()
    (Path(site) / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    work = tmp_path / "user"
    work.mkdir()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}

    def run(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(venv / "bin" / "hf-posenc"), *argv], cwd=work, env=env, capture_output=True,
                              text=True, timeout=1200)

    where = subprocess.run([python, "-c", "import hf_posenc; print(hf_posenc.__file__)"], cwd=work, env=env,
                           capture_output=True, text=True)
    assert where.returncode == 0 and where.stdout.startswith(site), where.stderr[-3000:]
    listed = run("recipes")
    assert listed.returncode == 0 and "smollm2-135m/alibi/smoke" in listed.stdout, listed.stderr
    copied = run("recipes", "copy", "smollm2-135m/alibi/smoke", "mine")
    assert copied.returncode == 0 and (work / "mine" / "README.md").is_file(), copied.stderr
    assets = tiny_assets(tmp_path / "assets")
    trained = run("train", "smollm2-135m/alibi/smoke", "--model_name_or_path", str(assets["model"]), "--dataset_name",
                  str(assets["data"]), "--seq_len", "32", "--max_steps", "2", "--save_strategy", "no",
                  "--perplexity_lengths", "32", "--output_dir", "run")
    assert trained.returncode == 0 and (work / "run" / "results.json").is_file(), trained.stderr[-2000:]
    # the demo's own flow and shipped recipe, on the tiny model (`make demo` runs it on SmolLM2)
    demo = run("demo", "--model", str(assets["model"]), "--steps", "2", "--lengths", "128", "--out", "demo")
    assert demo.returncode == 0, demo.stderr[-2000:]
    assert json.loads((work / "demo" / "results.json").read_text())["kind"] == "demo"
    print(f"installed-wheel run: {time.perf_counter() - start:.0f} s")
