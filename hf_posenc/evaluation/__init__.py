"""Score (patched) models in memory: perplexity by length, passkey retrieval, length generalisation
and sentiment classification, and the suites `hf-posenc eval` runs.

Everything runs on the model object itself, so a model patched with `hf_posenc.patch` is scored as
patched (evaluate's own perplexity metric reloads a model by id and cannot do that). Scores are
aggregated by the evaluate modules in `hf_posenc/metrics/`; suites write `hf_posenc.results`.

    scoring       running a model for scores (hidden states, fp32 logits, greedy answers, length limits)
    long_context  perplexity by length (same targets at every length, or sliding windows), prefix
                  perplexity, passkey retrieval
    tasks         length generalisation, sentiment classification
    ruler         RULER's synthetic tasks through lm-eval's generators and scorer, offline
    suites        the named suites, results.json as they run, compare
    processes     the same scores split over the processes of a launch (distributed=True)
"""

from .long_context import (
    PASSKEY_FILLER,
    PASSKEY_QUESTION,
    PASSKEY_TASK,
    PERPLEXITY_MODES,
    passkey,
    passkey_prompt,
    perplexity_by_length,
    prefix_perplexity,
    target_ends,
)
from .scoring import LENGTH_LIMITS, METRICS_DIR, load_metric, text_token_ids
from .ruler import RULER_TASKS, ruler_scores
from .suites import SUITES, compare, run_suites
from .tasks import SENTIMENT_PROMPT, classification, length_generalization

__all__ = [
    "LENGTH_LIMITS",
    "METRICS_DIR",
    "PASSKEY_FILLER",
    "PASSKEY_QUESTION",
    "PASSKEY_TASK",
    "PERPLEXITY_MODES",
    "RULER_TASKS",
    "SENTIMENT_PROMPT",
    "SUITES",
    "classification",
    "compare",
    "length_generalization",
    "load_metric",
    "passkey",
    "passkey_prompt",
    "perplexity_by_length",
    "prefix_perplexity",
    "ruler_scores",
    "run_suites",
    "target_ends",
    "text_token_ids",
]
