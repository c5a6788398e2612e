"""The pilot that set the study's lr and steps: one arm on one task, the in-distribution exact match measured every
`--every` steps while it trains (one thread), so the steps the gate needs can be read off.

    python benchmarks/lengthgen/pilot.py --task copy --arm nope --lr 3e-3 --steps 3000 --every 250
    python benchmarks/lengthgen/pilot.py --paper --task cmc --arm alibi --layers 2 --width 128 --heads 2 \
        --lr 1e-3 --steps 2000 --every 250 --log paper_pilot.jsonl     # the paper's split, its own lengths

With `--log`, the final record (settings and curve) is appended to that JSON-lines file.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
import transformers  # noqa: E402
from arms import arms  # noqa: E402
from settings import FULL, PAPER  # noqa: E402
from train import init_model, splits_of, tokenizer_of, train  # noqa: E402

from hf_posenc.evaluation.lengthgen import scoring  # noqa: E402


class Probe(transformers.TrainerCallback):
    """Exact match on the held-out in-distribution split every `every` steps, printed and kept."""

    def __init__(self, model, tokenizer, examples, every):
        self.model, self.tokenizer, self.examples, self.every, self.curve = model, tokenizer, examples, every, []
        self.t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.every == 0:
            self.model.eval()
            cell = scoring.pooled(scoring.score(self.model, self.tokenizer, self.examples, batch_size=64))
            self.model.train()
            self.curve.append({"step": state.global_step, "iid": round(cell["exact_match"], 3),
                               "wall_s": round(time.perf_counter() - self.t0, 1), "cpu_s": round(time.process_time(), 1)})
            print(json.dumps(self.curve[-1]), flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--paper", action="store_true", help="the paper's split (--task cmc, ...) at its own lengths")
    p.add_argument("--task", default="copy")
    p.add_argument("--arm", default="nope")
    p.add_argument("--lr", type=float)
    p.add_argument("--steps", type=int)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--layers", type=int)
    p.add_argument("--width", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--every", type=int, default=250)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train-lengths", type=int, help="train on lengths 1..N (the digit tasks; default 20)")
    p.add_argument("--log", help="append the final record to this JSON-lines file")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    base = PAPER if args.paper else FULL
    changes = {k: v for k, v in (("lr", args.lr), ("steps", args.steps), ("batch_size", args.batch_size),
                                 ("layers", args.layers), ("width", args.width), ("heads", args.heads))
               if v is not None}
    if not args.paper:
        n = args.train_lengths or max(FULL.train_lengths)
        changes.update(train_lengths=tuple(range(1, n + 1)), test_lengths=tuple(range(n + 1, 2 * n + 1)))
    s = dataclasses.replace(base, **changes)
    tokenizer = tokenizer_of(s)
    splits = splits_of(args.task, s, args.seed)
    model = init_model(arms(s.width)[args.arm], s, args.seed)
    probe = Probe(model, tokenizer, splits["iid"], args.every)
    train(model, splits["train"], s, tokenizer, args.seed, HERE / "work" / f"pilot-{args.arm}-{args.task}", s.steps,
          s.lr, callbacks=(probe,))
    record = {"task": args.task, "arm": args.arm, "paper": args.paper, "lr": s.lr, "batch_size": s.batch_size,
              "layers": s.layers, "width": s.width, "heads": s.heads, "steps": s.steps, "seed": args.seed,
              "params": sum(t.numel() for t in model.parameters()), "curve": probe.curve}
    print(json.dumps(record), flush=True)
    if args.log:
        with open(args.log, "a", encoding="utf-8") as log:
            log.write(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
