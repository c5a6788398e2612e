"""Why does T5's bias fail to repeat past length 20? The study's page once blamed its untrained far buckets (24-28);
yet it scores 0.00 at lengths 21-22. This probe retrains the study's T5 run on repeat (same settings, one seed) and
looks at what it learned instead of asserting a cause:

- which buckets training touched (the table starts at zero: a row still zero was never trained) and which buckets
  the sequences of each test length need (every query-key distance in them, T5's causal buckets);
- an intervention: the far buckets set to the last trained one's values, then scored again: if the far buckets were
  the cause, this repairs the lengths whose distances they hold;
- where the queries that predict the answer attend, per layer and head, at the longest trained length and the first
  test length: on the input symbol they must repeat, or not.

    python benchmarks/lengthgen/t5_probe.py [--seed 0] [--out benchmarks/lengthgen/results/t5_probe]

Writes OUT/t5_probe.json and OUT/t5_probe.md (about 2 min on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from arms import arms  # noqa: E402
from settings import FULL  # noqa: E402
from train import init_model, score, splits_of, tokenizer_of, train  # noqa: E402

from hf_posenc.evaluation.lengthgen import scoring  # noqa: E402
from hf_posenc.schemes.t5 import T5Bias, t5_bucket  # noqa: E402


def bias_module(model: torch.nn.Module) -> T5Bias:
    """The one shared bucket table (T5 shares it across layers)."""
    return next(m for m in model.modules() if isinstance(m, T5Bias))


def needed_buckets(bias: T5Bias, tokens: int) -> list[int]:
    """The buckets of every causal query-key distance in a sequence of `tokens` tokens."""
    distances = torch.arange(tokens)
    return sorted(set(t5_bucket(distances, True, bias.num_buckets, bias.max_distance).tolist()))


def exact_by_length(model: Any, tokenizer: Any, examples: list) -> dict[int, float]:
    return {int(n): round(c["exact_match"], 3) for n, c in score(model, tokenizer, examples, None).items() if "n" in c}


def attention_on_answers(model: Any, tokenizer: Any, example: Any) -> list[dict[str, Any]]:
    """Per layer and head, over the queries that predict the answer tokens: how often the key weighed most is the
    input symbol the next answer token repeats (n positions back: the answer repeats the input), and the mean
    weight on that key. One token a word: the word-level tokenizer of the study."""
    ids = torch.tensor([tokenizer(example.prompt + example.target)["input_ids"]])
    n = example.length
    start = len(tokenizer(example.prompt)["input_ids"]) - 1  # the separator's query predicts the first answer token
    queries = torch.arange(start, start + n)
    with torch.no_grad():
        out = model(ids, output_attentions=True)
    rows = []
    for layer, weights in enumerate(out.attentions):
        for head in range(weights.shape[1]):
            w = weights[0, head, queries]  # (n queries, keys)
            needed = queries - n
            hits = (w.argmax(-1) == needed).float().mean()
            rows.append({"layer": layer, "head": head, "argmax_at_needed": round(float(hits), 3),
                         "weight_on_needed": round(float(w[torch.arange(n), needed].mean()), 3)})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(HERE / "results" / "t5_probe"))
    args = p.parse_args()
    torch.set_num_threads(1)  # as the study runs, so the run equals its run file
    s, task, name = FULL, "repeat", "t5"
    tokenizer = tokenizer_of(s)
    splits = splits_of(task, s, args.seed)
    model = init_model(arms(s.width)[name], s, args.seed)
    print(f"training t5 on {task}, seed {args.seed}: {s.steps_of(task)} steps", flush=True)
    with tempfile.TemporaryDirectory() as work:
        train(model, splits["train"], s, tokenizer, args.seed, Path(work), s.steps_of(task), s.lr_of(name))
    model.eval()
    model.set_attn_implementation("eager")  # attention weights are returned by the eager path only
    bias = bias_module(model)
    table = bias.relative_attention_bias.weight.detach().clone()
    trained = [b for b in range(bias.num_buckets) if bool(table[b].abs().sum() > 0)]
    longest_train, first_test = max(s.train_lengths), min(s.test_lengths)
    need = {n: needed_buckets(bias, 2 * n + 2) for n in (longest_train, *s.test_lengths)}
    iid = scoring.pooled({n: c for n, c in score(model, tokenizer, splits["iid"], None).items() if "n" in c})
    ood = exact_by_length(model, tokenizer, splits["ood"])
    print(f"in distribution {iid['exact_match']:.3f}; past training {ood}", flush=True)
    last = max(trained)
    with torch.no_grad():
        bias.relative_attention_bias.weight[last + 1:] = table[last]
    repaired = exact_by_length(model, tokenizer, splits["ood"])
    # the bucket of the copy distance (n back) at the first test length, given the biases of the bucket that held
    # the copy distance at the longest trained length: the bucket the model used to copy
    copy_bucket = {n: int(t5_bucket(torch.tensor([n]), True, bias.num_buckets, bias.max_distance))
                   for n in (longest_train, first_test)}
    with torch.no_grad():
        bias.relative_attention_bias.weight.copy_(table)
        bias.relative_attention_bias.weight[copy_bucket[first_test]] = table[copy_bucket[longest_train]]
    copied = exact_by_length(model, tokenizer, splits["ood"])
    with torch.no_grad():
        bias.relative_attention_bias.weight.copy_(table)
    at = {n: next(e for e in [*splits["iid"], *splits["ood"]] if e.length == n) for n in (longest_train, first_test)}
    attention = {n: attention_on_answers(model, tokenizer, e) for n, e in at.items()}
    found = {"task": task, "seed": args.seed, "steps": s.steps_of(task), "lr": s.lr_of(name),
             "iid": iid["exact_match"], "ood_by_length": ood, "trained_buckets": trained,
             "needed_buckets": {str(n): b for n, b in need.items()},
             "table": [[round(v, 4) for v in row] for row in table.tolist()],
             "far_buckets_set_to_last_trained": {"from_bucket": last + 1, "ood_by_length": repaired},
             "copy_bucket": {str(n): b for n, b in copy_bucket.items()},
             "copy_bucket_set_to_trained": {"ood_by_length": copied},
             "answer_attention": {str(n): rows for n, rows in attention.items()}}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "t5_probe.json").write_text(json.dumps(found, indent=1) + "\n")
    (out / "t5_probe.md").write_text(report(found))
    print((out / "t5_probe.md").read_text())


def report(found: dict[str, Any]) -> str:
    """The probe's findings as Markdown: facts measured, and only the conclusions they support."""
    ood, repaired, copied = ({int(n): v for n, v in table.items()} for table in  # int keys, from the run or JSON
                             (found["ood_by_length"], found["far_buckets_set_to_last_trained"]["ood_by_length"],
                              found["copy_bucket_set_to_trained"]["ood_by_length"]))
    (train_n, train_b), (test_n, test_b) = sorted((int(n), b) for n, b in found["copy_bucket"].items())
    needed = found["needed_buckets"]
    heads = next(iter(found["answer_attention"].values()))
    all_trained = [n for n, b in needed.items() if set(b) <= set(found["trained_buckets"]) and int(n) in ood]
    lines = [f"T5 bias on repeat, seed {found['seed']} ({found['steps']} steps at lr {found['lr']}): "
             f"{found['iid']:.3f} in distribution.", "",
             f"- Buckets training moved from zero: {found['trained_buckets']}.",
             f"- Test lengths whose every query-key distance falls in a trained bucket: "
             f"{', '.join(all_trained) or 'none'}; exact match there: "
             f"{', '.join(f'{n}: {ood[int(n)]:.2f}' for n in all_trained) or '–'}.",
             f"- Far buckets ({found['far_buckets_set_to_last_trained']['from_bucket']}+) set to the last trained "
             f"bucket's biases: exact match by length before / after: "
             + ", ".join(f"{n}: {ood[n]:.2f} / {repaired[n]:.2f}" for n in sorted(ood)) + ".",
             f"- The copy distance (n back) is in bucket {train_b} at length {train_n} and {test_b} at length {test_n}; "
             f"training's copy distances (1 to {train_n}) all lie in buckets up to {train_b}. Bucket {test_b} given "
             f"bucket {train_b}'s biases: exact match by length before / after: "
             + ", ".join(f"{n}: {ood[n]:.2f} / {copied[n]:.2f}" for n in sorted(ood)[:5]) + ".", "",
             "Attention of the queries that predict the answer, per layer and head: the share whose most-weighted "
             "key is the input symbol to repeat (n back), and the mean weight on it, at the longest trained length "
             "and the first test length:", "",
             "| length | " + " | ".join(f"L{r['layer']}H{r['head']}" for r in heads) + " |",
             "|---|" + "---|" * len(heads)]
    for n, rows in found["answer_attention"].items():
        lines.append(f"| {n} | " + " | ".join(f"{r['argmax_at_needed']:.2f} ({r['weight_on_needed']:.2f})"
                                             for r in rows) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
