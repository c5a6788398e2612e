"""The study's budget: the full run and the smoke run the test uses.

The full budget is what fits 10 arms x 3 seeds in about 80-90 minutes on 2 CPU cores (a step of 16 x 128
tokens takes ~0.73 s there, so a run is ~2.5 minutes with its scoring)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Settings:
    layers: int = 4
    width: int = 256
    heads: int = 4  # width and width + width // 4 both divide by it
    vocab: int = 8192  # a BPE trained on the corpus keeps the embedding from dominating a small model
    seq_len: int = 128  # training length; scored at 1x, 2x and 4x
    steps: int = 160
    batch_size: int = 16  # sequences per step: steps * batch_size * seq_len tokens per run (~0.33M)
    lr: float = 1e-3
    seeds: tuple[int, ...] = (0, 1, 2)
    checkpoints: int = 4  # geometry and four terms of the added arms at this many points of training
    windows: int = 16  # same-target perplexity windows per length
    target: int = 64  # tokens scored per window, the same at every length
    passkey_trials: int = 4  # per length, needle at depth 0.5
    eval_fraction: float = 0.02  # the tail of the KJV (Revelation) is held out, as in the recipes

    @property
    def tokens(self) -> int:
        """Training tokens per run."""
        return self.steps * self.batch_size * self.seq_len


FULL = Settings()
SMOKE = Settings(layers=1, width=64, heads=4, vocab=512, seq_len=32, steps=4, batch_size=4, seeds=(0,),
                 checkpoints=2, windows=2, target=16, passkey_trials=1)
