"""Evaluation on tiny models, each metric against a hand computation; bad input; the eval command."""

from __future__ import annotations

import math
import string

import datasets
import pytest
import torch
from conftest import TINY, DeviceWithoutFloat64, tiny_model
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

import hf_posenc
from hf_posenc import cli, data, evaluation, loading, results
from hf_posenc.errors import PosEncError


def char_tokenizer(pad: bool = True) -> PreTrainedTokenizerFast:
    """A real fast tokenizer with one token per character (98 ids), so it fits the tiny models' vocabulary."""
    chars = ["<pad>", "<unk>", *string.printable[:-5], "\n"]
    tok = Tokenizer(models.WordLevel({c: i for i, c in enumerate(chars)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>" if pad else None)


class InductionLM(torch.nn.Module):
    """A rigged LM: predicts the token that followed the longest earlier match of the current suffix
    (an ideal induction head), searching `memory` tokens before the input too. It retrieves a passkey
    from any depth, and it reproduces memorised sequences but nothing else."""

    def __init__(self, vocab: int = TINY["vocab"], memory: list[int] | None = None) -> None:
        super().__init__()
        self.lm_head = torch.nn.Linear(vocab, vocab, bias=False)
        torch.nn.init.eye_(self.lm_head.weight)
        self.memory = torch.tensor(memory or [], dtype=torch.long)

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.lm_head

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
        rows = []
        for row in input_ids:
            ids = torch.cat([self.memory, row])
            run = torch.zeros(len(ids), dtype=torch.long)  # run[j]: length of the match ending at j
            preds = []
            for t in range(len(ids)):
                run = torch.where(ids == ids[t], torch.cat([run.new_zeros(1), run[:-1]]) + 1, 0)
                run[t:] = 0
                j = len(ids) - 1 - int(run.flip(0).argmax())  # latest longest match
                preds.append(ids[j + 1] if run[j] > 0 else ids[t])
            rows.append(torch.stack(preds[len(self.memory) :]))
        onehot = torch.nn.functional.one_hot(torch.stack(rows), self.lm_head.in_features).float()
        return self.lm_head(onehot)


@pytest.fixture(scope="module")
def kjv_ids() -> torch.Tensor:
    return evaluation.text_token_ids(char_tokenizer(), data.long_text("kjv"), 2000)


# ---------------------------------------------------------------- perplexity


@pytest.mark.parametrize("model_type", ["llama", "gpt2"])
def test_uniform_model_has_perplexity_equal_to_vocab_size(model_type, kjv_ids):
    model = tiny_model(model_type)
    with torch.no_grad():  # zero logits = a uniform next-token distribution
        model.get_output_embeddings().weight.zero_()
    result = evaluation.perplexity_by_length(model, kjv_ids, [16, 48], stride=8, batch_size=2, max_windows=5,
                                             mode="sliding")
    for cell in result.values():
        assert cell["perplexity"] == pytest.approx(TINY["vocab"], rel=1e-5)


@pytest.mark.parametrize("model_type,batch_size", [("llama", 1), ("llama", 3), ("gpt2", 2)])
def test_stride_equal_to_window_is_the_plain_chunked_loss(model_type, batch_size, kjv_ids):
    model = tiny_model(model_type)
    result = evaluation.perplexity_by_length(model, kjv_ids, [32], batch_size=batch_size, max_windows=5,
                                           mode="sliding")[32]
    with torch.no_grad():
        losses = [model(c[None], labels=c[None]).loss for c in kjv_ids[: 5 * 32].split(32)]
    assert result["windows"] == 5 and result["tokens"] == 5 * 31
    assert result["loss"] == pytest.approx(torch.stack(losses).mean().item(), abs=1e-5)


def test_sliding_window_scores_each_token_once_with_its_context(kjv_ids):
    model, length, stride = tiny_model("llama"), 24, 10
    result = evaluation.perplexity_by_length(model, kjv_ids, [length], stride=stride, batch_size=2, max_windows=4,
                                           mode="sliding")[length]
    nll = []
    with torch.no_grad():
        for w, start in enumerate(range(0, 4 * stride, stride)):
            window = kjv_ids[start : start + length]
            logp = torch.log_softmax(model(window[None]).logits[0].double(), -1)
            first = 1 if w == 0 else length - stride  # tokens no earlier window scored
            nll += [-logp[t - 1, window[t]] for t in range(first, length)]
    assert result["tokens"] == len(nll) == (length - 1) + 3 * stride
    assert result["loss"] == pytest.approx(torch.stack(nll).mean().item(), abs=1e-5)


def test_same_target_mode_scores_the_same_tokens_at_every_length_with_only_the_context_growing(kjv_ids):
    model, lengths, target = tiny_model("llama"), [12, 30, 60], 8
    seen: list[torch.Tensor] = []  # every window the model ran, as the decoder received it
    hook = model.model.register_forward_pre_hook(lambda m, a, kw: seen.append(kw["input_ids"].clone()),
                                                 with_kwargs=True)
    result = evaluation.perplexity_by_length(model, kjv_ids, lengths, max_windows=3, target=target, batch_size=2)
    hook.remove()
    windows = {L: torch.cat([batch for batch in seen if batch.shape[1] == L]) for L in lengths}
    assert [w.shape for w in windows.values()] == [(3, L) for L in lengths]  # each length sees exactly L tokens
    targets = windows[60][:, -target:]
    ends = evaluation.target_ends(kjv_ids.numel(), 60, target, 3)
    assert torch.equal(targets, torch.stack([kjv_ids[e - target : e] for e in ends]))
    assert len(set(ends)) == 3 and min(b - a for a, b in zip(ends, ends[1:])) >= target  # many places, no overlap
    for L in lengths:
        assert torch.equal(windows[L][:, -target:], targets)  # the same target ids at every length
        assert torch.equal(windows[L], windows[60][:, -L:])  # the shorter context is the end of the longer one
        cell = result[L]
        assert cell["mode"] == "same_target" and cell["target"] == target and cell["tokens"] == 3 * target
        with torch.no_grad():  # the loss is that of the last `target` tokens of each window, by hand
            logp = torch.log_softmax(model(windows[L]).logits.double(), -1)
        nll = -logp[:, -target - 1 : -1].gather(-1, windows[L][:, -target:, None])
        assert cell["loss"] == pytest.approx(nll.mean().item(), abs=1e-5)
    assert len({result[L]["targets"] for L in lengths}) == 1
    sliding = evaluation.perplexity_by_length(model, kjv_ids, lengths, max_windows=3, mode="sliding")
    assert len({sliding[L]["targets"] for L in lengths}) == 3  # the first L tokens differ with L


@pytest.mark.parametrize("kwargs,message", [
    ({"mode": "first"}, "unknown perplexity mode 'first'; choose from same_target"),
    ({"target": 16}, r"target must be in 1..15"),
    ({"target": 4, "longest": 20}, "longest >= 32"),
    ({"stride": 8}, "a stride applies to the sliding perplexity mode, not 'same_target'"),
])
def test_same_target_bad_input_names_what_is_allowed(kwargs, message, kjv_ids):
    with pytest.raises(PosEncError, match=message):
        evaluation.perplexity_by_length(tiny_model("llama"), kjv_ids, [16, 32], **kwargs)


def test_prefix_perplexity_equals_one_window_per_length(kjv_ids):
    model = tiny_model("qwen2")
    lengths = [8, 40, 100]
    fast = evaluation.prefix_perplexity(model, kjv_ids, lengths)
    slow = evaluation.perplexity_by_length(model, kjv_ids, lengths, max_windows=1, mode="sliding")
    for L in lengths:
        assert fast[L]["tokens"] == slow[L]["tokens"] == L - 1
        assert fast[L]["loss"] == pytest.approx(slow[L]["loss"], abs=1e-5)


def test_bf16_model_is_scored_in_fp32(kjv_ids):
    model = tiny_model("llama")
    fp32 = evaluation.perplexity_by_length(model, kjv_ids, [32], max_windows=2)[32]["loss"]
    bf16 = evaluation.perplexity_by_length(model.to(torch.bfloat16), kjv_ids, [32], max_windows=2)[32]["loss"]
    assert math.isfinite(bf16) and bf16 == pytest.approx(fp32, abs=0.05)


def test_a_length_past_a_learned_table_is_skipped_and_the_others_kept(kjv_ids):
    model = tiny_model("gpt2")  # 64 learned positions
    result = evaluation.perplexity_by_length(model, kjv_ids, [32, 128, 48], max_windows=2)
    assert list(result) == [32, 128, 48]
    assert "IndexError" in result[128]["skipped"]
    assert result[32]["perplexity"] > 1 and result[48]["perplexity"] > 1
    assert "fewer than 5000" in evaluation.perplexity_by_length(model, kjv_ids, [5000])[5000]["skipped"]


def cuda_like_lookup(table: torch.nn.Embedding, args: tuple) -> None:
    """What CUDA does with an index past a table: a device-side assert (a RuntimeError, after which the
    process's CUDA context is lost), not the IndexError a CPU raises."""
    if int(args[0].max()) >= table.num_embeddings:
        raise RuntimeError("CUDA error: device-side assert triggered")


def test_a_length_past_a_learned_table_is_refused_before_the_forward(kjv_ids):
    """The length is skipped as on CPU, by the model's table size, without the lookup ever running."""
    model = tiny_model("gpt2")  # 64 learned positions
    model.transformer.wpe.register_forward_pre_hook(cuda_like_lookup)
    result = evaluation.perplexity_by_length(model, kjv_ids, [32, 128], max_windows=2)
    assert "IndexError" in result[128]["skipped"] and "64 positions" in result[128]["skipped"]
    assert result[32]["perplexity"] > 1
    assert set(evaluation.prefix_perplexity(model, kjv_ids, [32, 65])) == {32, 65}
    assert "64 positions" in evaluation.prefix_perplexity(model, kjv_ids, [32, 65])[65]["skipped"]
    assert "64 positions" in evaluation.passkey(model, char_tokenizer(), [400], depths=[0.5], trials=1)[400]["skipped"]


def test_token_nll_makes_no_float64_on_the_models_device():
    """MPS has no float64: the losses accumulate in float64 only once on the CPU."""
    head = torch.nn.Linear(8, TINY["vocab"], device="meta")
    hidden, targets = torch.randn(5, 8, device="meta"), torch.randint(0, TINY["vocab"], (5,))
    with DeviceWithoutFloat64() as device:
        nll = evaluation.scoring.token_nll(head, hidden, targets)
    assert device.created == [] and nll.dtype == torch.float64 and nll.device.type == "cpu"


@pytest.mark.parametrize("lengths", [[0], [16, -4], [2.5]])
def test_non_positive_lengths_are_refused(lengths, kjv_ids):
    with pytest.raises(PosEncError, match="positive integer"):
        evaluation.perplexity_by_length(tiny_model("llama"), kjv_ids, lengths)


def test_perplexity_needs_a_causal_lm_and_1d_ids(kjv_ids):
    with pytest.raises(PosEncError, match="AutoModelForCausalLM"):
        evaluation.perplexity_by_length(tiny_model("bert"), kjv_ids, [16])
    with pytest.raises(PosEncError, match="1-D"):
        evaluation.perplexity_by_length(tiny_model("llama"), kjv_ids[None], [16])


def test_patched_model_is_scored_as_patched(kjv_ids):
    model = tiny_model("llama")
    before = evaluation.perplexity_by_length(model, kjv_ids, [48], max_windows=1)[48]["loss"]
    hf_posenc.patch(model, "alibi")
    patched = evaluation.perplexity_by_length(model, kjv_ids, [48], max_windows=1)[48]["loss"]
    hf_posenc.unpatch(model)
    after = evaluation.perplexity_by_length(model, kjv_ids, [48], max_windows=1)[48]["loss"]
    assert patched != pytest.approx(before, abs=1e-4)
    assert after == pytest.approx(before, abs=1e-6)


# ---------------------------------------------------------------- passkey


def test_passkey_prompt_is_the_landmark_prompt_within_length():
    tok = char_tokenizer()
    for depth in (0.0, 0.5, 1.0):
        prompt = evaluation.passkey_prompt(tok, 700, depth, 4242)
        assert prompt.startswith(evaluation.PASSKEY_TASK) and prompt.endswith(evaluation.PASSKEY_QUESTION)
        assert "The pass key is 4242. Remember it. 4242 is the pass key." in prompt
        assert 600 < len(tok(prompt + " 4242")["input_ids"]) <= 700
    positions = [evaluation.passkey_prompt(tok, 1200, d, 7).index("pass key is 7") for d in (0.0, 0.5, 1.0)]
    assert positions == sorted(positions) and positions[0] < positions[2]


def test_passkey_accuracy_of_a_rigged_model_is_one():
    result = evaluation.passkey(InductionLM(), char_tokenizer(), [400, 700], depths=[0.0, 0.5, 1.0], trials=2)
    for length, cell in result.items():
        assert cell["accuracy"] == 1.0 and cell["trials"] == cell["n"] == 6
        assert set(cell["by_depth"].values()) == {1.0}
        assert cell["high"] == 1.0 and round(cell["low"], 4) == 0.6097  # Wilson 6/6: 6 / (6 + 1.96^2)
        assert cell["tokens"] <= length


def test_passkey_of_a_random_model_fails_and_short_lengths_are_skipped():
    result = evaluation.passkey(tiny_model("llama"), char_tokenizer(), [100, 400], depths=[0.5], trials=2)
    assert "too short" in result[100]["skipped"]
    assert result[400]["accuracy"] == 0.0


# ---------------------------------------------------------------- length generalisation


def test_length_generalization_of_a_memoriser_fails_past_the_training_lengths():
    tok = char_tokenizer()
    splits = data.length_generalization_splits("reverse", [2, 3], [6], n_train=10, n_test=10)
    seen = splits["train"]
    memory = tok("\n".join(p + t for p, t in zip(seen["prompt"], seen["target"])) + "\n")["input_ids"]
    rig = InductionLM(memory=memory)
    test = datasets.concatenate_datasets([splits["train"], splits["test"]])
    result = evaluation.length_generalization(rig, tok, test, batch_size=4)
    assert result["by_length"][2] == result["by_length"][3] == 1.0
    assert result["by_length"][6] == 0.0
    assert result["exact_match"] == pytest.approx(20 / 30)


# ---------------------------------------------------------------- classification


def _sentiment(n: int = 12) -> datasets.Dataset:
    return data.sentiment_dataset()["test"].select(range(n))


def test_zero_shot_classification_matches_a_hand_computation():
    model, tok, rows = tiny_model("llama"), char_tokenizer(), _sentiment()
    result = evaluation.classification(model, tok, rows, batch_size=5)
    n_id, p_id = tok.convert_tokens_to_ids(["n", "p"])  # " negative" / " positive" differ at the 2nd character
    predictions = []
    with torch.no_grad():
        for text in rows["text"]:
            ids = tok(evaluation.SENTIMENT_PROMPT.format(text=text) + " ", return_tensors="pt")["input_ids"]
            last = model(ids).logits[0, -1]
            predictions.append(int(last[p_id] > last[n_id]))
    accuracy = sum(p == y for p, y in zip(predictions, rows["label"])) / len(rows)
    assert result["mode"] == "zero-shot" and result["examples"] == 12
    assert result["accuracy"] == pytest.approx(accuracy)


def test_classifier_head_classification_matches_argmax():
    # sentences that fit the tiny BERT's 64 learned positions under a character tokenizer
    rows = _sentiment(300).filter(lambda r: len(r["text"]) < 60).select(range(8))
    model, tok = tiny_model("bert", head="cls"), char_tokenizer()
    result = evaluation.classification(model, tok, rows, batch_size=4)
    with torch.no_grad():
        predictions = [model(**tok(t, return_tensors="pt")).logits.argmax(-1).item() for t in rows["text"]]
    assert result["mode"] == "classifier"
    assert result["accuracy"] == pytest.approx(sum(p == y for p, y in zip(predictions, rows["label"])) / len(rows))
    assert 0.0 <= result["f1"] <= 1.0


def test_classification_bad_input_names_the_fix():
    rows = _sentiment()
    with pytest.raises(PosEncError, match="pad_token"):
        evaluation.classification(tiny_model("llama"), char_tokenizer(pad=False), rows)
    with pytest.raises(PosEncError, match="text_column"):
        evaluation.classification(tiny_model("llama"), char_tokenizer(), rows.rename_column("text", "sentence"))
    with pytest.raises(PosEncError, match="pad_token"):
        evaluation.length_generalization(tiny_model("llama"), char_tokenizer(pad=False),
                                         data.synthetic_task("copy", 3, 4), batch_size=2)


# ---------------------------------------------------------------- the eval command


@pytest.fixture
def saved_tiny(tmp_path):
    """A tiny model folder + tokenizer, as `hf-posenc eval --model PATH` reads it."""
    def save(model_type: str, pad: bool = True):
        folder = tmp_path / model_type
        tiny_model(model_type).save_pretrained(folder)
        char_tokenizer(pad).save_pretrained(folder)
        return str(folder)
    return save


def test_eval_command_keeps_results_when_a_later_length_fails(saved_tiny, tmp_path):
    out = tmp_path / "run"
    code = cli.main(["eval", "--model", saved_tiny("gpt2"), "--suite", "ppl", "--lengths", "32,128",
                     "--perplexity.max-windows", "2", "--out", str(out)])
    record = results.load(out / "results.json")
    assert code == 0 and record.complete is True and record.kind == "eval"
    (run,) = record.runs
    assert run.metrics["perplexity"]["32"]["perplexity"] > 1
    assert "IndexError" in run.metrics["perplexity"]["128"]["skipped"]
    assert run.scheme is None and record.versions["torch"] == torch.__version__
    assert (out / "perplexity.png").stat().st_size > 1000


class BrokenLM(torch.nn.Module):
    """A causal LM whose forward fails with an error that is a bug, not a length limit."""

    def __init__(self) -> None:
        super().__init__()
        self.lm_head = torch.nn.Linear(4, TINY["vocab"])

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.lm_head

    def forward(self, input_ids: torch.Tensor, **kwargs) -> torch.Tensor:
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")


def test_a_bug_during_scoring_propagates_instead_of_skipping_the_length(kjv_ids):
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        evaluation.perplexity_by_length(BrokenLM(), kjv_ids, [16])
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        evaluation.prefix_perplexity(BrokenLM(), kjv_ids, [16])
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        evaluation.passkey(BrokenLM(), char_tokenizer(), [400], depths=[0.5], trials=1)


def test_results_on_disk_survive_a_crash_in_a_later_suite(tmp_path):
    model = tiny_model("llama")
    with pytest.raises(PosEncError, match="pad_token"):
        evaluation.run_suites(model, char_tokenizer(pad=False),
                              evaluation.SuiteSettings(["ppl", "rotten_tomatoes"], [16, 32], perplexity={"max_windows": 1}), tmp_path)
    record = results.load(tmp_path / "results.json")
    assert record.complete is False
    assert set(record.runs[0].metrics["perplexity"]) == {"16", "32"}


def test_sst2_is_the_glue_task_and_needs_the_hub(tmp_path):
    with pytest.raises(PosEncError, match="could not load dataset 'glue'.*eval suite rotten_tomatoes"):
        evaluation.run_suites(tiny_model("llama"), char_tokenizer(), evaluation.SuiteSettings(["sst2"], [16]), tmp_path)


def test_eval_command_patches_and_compares(saved_tiny, tmp_path):
    folder = saved_tiny("llama")
    runs = []
    for name, extra in [("orig", []), ("yarn", ["--patch", "yarn", "--opt", "factor=2"])]:
        out = tmp_path / name
        assert cli.main(["eval", "--model", folder, *extra, "--suite", "ppl,passkey,copy", "--lengths", "64,400",
                         "--perplexity.max-windows", "1", "--passkey.depths", "0,1", "--passkey.trials", "1", "--synthetic.task-lengths", "2,3",
                         "--synthetic.examples", "3", "--out", str(out)]) == 0
        runs.append(out / "results.json")
    (orig,), (yarn, baseline) = results.load(runs[0]).runs, results.load(runs[1]).runs
    assert yarn.scheme == "yarn" and yarn.posenc["options"]["factor"] == 2.0 and yarn.posenc["from"] == "rope"
    # the baseline row is the model before the patch, scored with the same settings: the original's numbers
    assert baseline.label == "llama (unpatched)" and baseline.metrics == orig.metrics != yarn.metrics
    peaks = results.load(runs[1]).details["peak_memory_mb"]  # per run, in MB: a real process's resident peak
    assert peaks.keys() == {yarn.label, baseline.label} and all(50 < mb < 24 * 2**10 for mb in peaks.values())
    assert set(yarn.metrics) == {"perplexity", "passkey", "copy"}
    assert "too short" in yarn.metrics["passkey"]["64"]["skipped"]
    assert set(yarn.metrics["copy"]["3"]) == {"exact_match", "n", "low", "high"} and yarn.metrics["copy"]["3"]["n"] == 3
    assert (tmp_path / "orig" / "passkey.png").is_file()
    assert cli.main(["eval", "--compare", *map(str, runs), "--out", str(tmp_path / "cmp")]) == 0
    table = (tmp_path / "cmp" / "compare.md").read_text()
    assert "yarn(factor=2)" in table and "(as loaded)" in table and "| perplexity @ 400 tokens |" in table
    assert "| passkey accuracy @ 64 tokens | skipped (length 64 is too short" in table
    assert (tmp_path / "cmp" / "perplexity.png").is_file() and (tmp_path / "cmp" / "passkey.png").is_file()


def test_eval_records_the_perplexity_mode_and_compare_refuses_mixing_modes(saved_tiny, tmp_path):
    folder, paths = saved_tiny("llama"), []
    for mode in ("same_target", "sliding"):
        out = tmp_path / mode
        assert cli.main(["eval", "--model", folder, "--suite", "ppl", "--lengths", "16,48", "--perplexity.max-windows", "2",
                         "--perplexity.mode", mode, "--perplexity.target-tokens", "6", "--no-baseline", "--out", str(out)]) == 0
        paths.append(out / "results.json")
    same, sliding = (results.load(path) for path in paths)
    same_settings, sliding_settings = same.suites["perplexity"].settings, sliding.suites["perplexity"].settings
    assert same_settings["perplexity_mode"] == "same_target" and same_settings["target_tokens"] == 6
    assert sliding_settings["perplexity_mode"] == "sliding" and sliding_settings["target_tokens"] is None
    cells = same.runs[0].metrics["perplexity"]
    assert cells["16"]["targets"] == cells["48"]["targets"] and cells["48"]["tokens"] == 2 * 6
    with pytest.raises(PosEncError, match=r"measured differently \(.*perplexity.method.*--mixed"):
        evaluation.compare(paths, tmp_path / "refused")
    table = evaluation.compare(paths, tmp_path / "cmp", mixed=True)
    assert "perplexity.method=the last T tokens of windows" in table and "perplexity.method=sliding windows" in table


@pytest.mark.parametrize("argv,message", [
    (["--suite", "ppl,bleu"], "unknown suite 'bleu'"),
    (["--suite", "sentiment"], "rotten_tomatoes, sst2"),
    (["--lengths", "512,0"], "positive integer"),
    (["--lengths", "1k"], "comma-separated integers"),
    (["--opt", "factor=2"], "--opt and --layers need --patch SCHEME"),
    (["--suite", "passkey", "--passkey.depths", "0.5,2"], "depths in [0, 1]"),
    (["--lengths", "16,48", "--perplexity.target-tokens", "16"], "--perplexity.target-tokens: the tokens scored per window must be in 1..15"),
    (["--perplexity.mode", "first"], "unknown perplexity mode 'first'; choose from same_target"),
    (["--perplexity.stride", "8"], "a stride applies to the sliding perplexity mode"),
])
def test_eval_command_bad_input(argv, message, saved_tiny, tmp_path, capsys):
    code = cli.main(["eval", "--model", saved_tiny("llama"), *argv, "--out", str(tmp_path / "x")])
    assert code == 2 and message in capsys.readouterr().err


def test_load_model_names_the_install_command_for_a_missing_package(monkeypatch):
    from hf_posenc import models

    monkeypatch.setitem(models.NAMED_MODELS, "absent",
                        ("no-such-dist-xyz", "x", {"gguf_file": "x.gguf"}, "Absent", "pip install no-such-dist-xyz"))
    with pytest.raises(PosEncError, match="pip install no-such-dist-xyz"):
        loading.load_model("absent")


@pytest.mark.slow
def test_smollm2_end_to_end(tmp_path):
    out = tmp_path / "smol"
    code = cli.main(["eval", "--model", "smollm2", "--suite", "ppl,passkey,rotten_tomatoes", "--lengths", "300",
                     "--perplexity.max-windows", "1", "--passkey.depths", "0.5", "--passkey.trials", "1", "--sentiment.limit", "16", "--out", str(out)])
    metrics = results.load(out / "results.json").runs[0].metrics
    sentiment = metrics["classification"]["rotten_tomatoes"]
    assert code == 0
    assert 1.5 < metrics["perplexity"]["300"]["perplexity"] < 10  # ASSETS.md: loss ~2.7 on plain English
    assert metrics["passkey"]["300"]["accuracy"] == 1.0
    assert sentiment["mode"] == "zero-shot" and sentiment["examples"] == 16
