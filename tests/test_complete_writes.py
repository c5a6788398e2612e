"""A folder is marked complete only when its command did everything it promised (issue 61): `hf-posenc patch` once
exited 1 after writing a 538 MB folder whose marker said `"complete": true` (the model card failed after the
save), and the rerun answered "--out is not empty". Commands that write a folder in one go write it under a
temporary name (`folders.writing`); a failure at any point leaves no folder, or the earlier one bit-identical.

The failures are real exceptions raised where the command would fail (a model card that cannot be written, an
interrupt), injected with monkeypatch into the real command running in-process.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from conftest import TINY, tiny_model
from hf_posenc import cli, folders, hub


def _digest(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    folder = tmp_path_factory.mktemp("complete") / "tiny"
    tiny_model("gpt2").save_pretrained(folder)
    backend = Tokenizer(models.WordLevel({f"w{i}": i for i in range(TINY["vocab"])}, unk_token="w0"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="w0").save_pretrained(folder)
    return folder


def _card_fails(*args: object, **kwargs: object) -> None:
    raise OSError("no space left on device (injected)")


def test_a_patch_failing_after_its_save_leaves_no_folder_and_the_rerun_works(tiny, tmp_path, monkeypatch, capsys):
    out = tmp_path / "patched"
    monkeypatch.setattr(hub, "model_card", _card_fails)
    assert cli.main(["patch", str(tiny), "alibi", "--out", str(out)]) == 1
    assert "injected" in capsys.readouterr().err
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no staging folder left either
    monkeypatch.undo()
    assert cli.main(["patch", str(tiny), "alibi", "--out", str(out)]) == 0  # not "--out is not empty"
    record = folders.read_marker(out)
    assert record["complete"] is True and record["command"] == "patch"
    assert (out / "README.md").is_file() and (out / "model.safetensors").is_file()
    assert "patched" in (out / "README.md").read_text()  # the card names the folder, not its temporary name


def test_a_failed_overwrite_leaves_the_earlier_folder_bit_identical(tiny, tmp_path, monkeypatch):
    out = tmp_path / "patched"
    assert cli.main(["patch", str(tiny), "alibi", "--out", str(out)]) == 0
    before = _digest(out)
    monkeypatch.setattr(hub, "model_card", _card_fails)
    assert cli.main(["patch", str(tiny), "rope", "--out", str(out), "--overwrite"]) == 1
    assert _digest(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["patched"]
    monkeypatch.undo()
    assert cli.main(["patch", str(tiny), "rope", "--out", str(out), "--overwrite"]) == 0
    assert _digest(out) != before and folders.read_marker(out)["complete"] is True


def test_an_interrupt_inside_a_write_leaves_nothing(tmp_path):
    out = tmp_path / "staged"
    with pytest.raises(KeyboardInterrupt):
        with folders.writing(out, "inspect") as staged:
            staged.mkdir()
            (staged / "half.png").write_bytes(b"\x89PNG")
            raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_a_write_refuses_a_folder_that_appeared_unmarked_meanwhile(tmp_path):
    """check_out passed on a new folder; someone else's files appeared before the end: never replaced."""
    out = tmp_path / "theirs"
    with pytest.raises(folders.PosEncError, match="no .hf-posenc.json marker"):
        with folders.writing(out, "inspect") as staged:
            staged.mkdir()
            out.mkdir()
            (out / "their.txt").write_text("keep me")
    assert (out / "their.txt").read_text() == "keep me" and sorted(p.name for p in tmp_path.iterdir()) == ["theirs"]
