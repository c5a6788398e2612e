"""The pilot that set the study's lr and steps: one arm on one task, the in-distribution exact match measured every
`--every` steps while it trains (one thread), so the steps the gate needs can be read off.

    python benchmarks/lengthgen/pilot.py --task copy --arm nope --lr 3e-3 --steps 3000 --every 250
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
from settings import FULL  # noqa: E402
from train import init_model, train  # noqa: E402

from hf_posenc.evaluation.lengthgen import scoring, tasks  # noqa: E402
from hf_posenc.evaluation.lengthgen.vocab import build_tokenizer  # noqa: E402


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
    p.add_argument("--task", default="copy")
    p.add_argument("--arm", default="nope")
    p.add_argument("--lr", type=float, default=FULL.lr)
    p.add_argument("--steps", type=int, default=FULL.steps)
    p.add_argument("--batch-size", type=int, default=FULL.batch_size)
    p.add_argument("--every", type=int, default=250)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train-lengths", type=int, default=max(FULL.train_lengths), help="train on lengths 1..N")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    n = args.train_lengths
    s = dataclasses.replace(FULL, lr=args.lr, steps=args.steps, batch_size=args.batch_size,
                            train_lengths=tuple(range(1, n + 1)), test_lengths=tuple(range(n + 1, 2 * n + 1)))
    tokenizer = build_tokenizer()
    splits = tasks.split(args.task, s.train_lengths, s.test_lengths, train=s.train_examples, iid=s.iid_per_length,
                         test=s.test_per_length, seed=args.seed)
    model = init_model(arms(s.width)[args.arm], s, args.seed)
    probe = Probe(model, tokenizer, splits["iid"], args.every)
    train(model, splits["train"], s, tokenizer, args.seed, HERE / "work" / "pilot", args.steps, callbacks=(probe,))
    print(json.dumps({"task": args.task, "arm": args.arm, "lr": args.lr, "batch_size": args.batch_size, "train_lengths": n,
                      "steps": args.steps, "curve": probe.curve}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
