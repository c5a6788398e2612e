"""The names `hf-posenc eval` takes (suites, RULER tasks, perplexity modes) and their checks: no torch,
so the command line refuses a typo at once, before anything heavy is imported."""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import PosEncError
from ..results import RULER_TASKS, SYNTHETIC_TASKS

# Sentiment suites: suite -> (datasets name, config, split scored). rotten_tomatoes is the offline set
# `hf_posenc.data.sentiment_dataset` builds; sst2 is GLUE's (Hub only; its test labels are hidden).
SENTIMENT = {"rotten_tomatoes": (None, None, "test"), "sst2": ("glue", "sst2", "validation")}
# The same tasks as input -> output pairs for encoder-decoders (hf_posenc.data.seq2seq_pairs): the only
# suites those take, and only those.
SEQ2SEQ_SUITES = tuple(f"seq2seq_{task}" for task in SYNTHETIC_TASKS)
SUITES = ("perplexity", "passkey", *SENTIMENT, *SYNTHETIC_TASKS, "ruler", *SEQ2SEQ_SUITES)
ALIASES = {"ppl": "perplexity"}

# How `perplexity_by_length` picks the tokens it scores at each context length L.
PERPLEXITY_MODES: dict[str, str] = {
    # Like with like: the difficulty of the first L tokens of a text changes with L (a book's opening
    # is harder than its middle), so a length table of those mixes context with content. Here only the
    # context grows: the same target tokens are scored at every L.
    "same_target": "the last T tokens of windows of length L ending at the same places of the text, for every L",
    # The transformers docs' sliding windows from the start of the text: each length scores other tokens.
    "sliding": "sliding windows from the start of the text, each token scored once",
}
DEFAULT_MODE = "same_target"

NOT_OFFLINE = {
    "qa_squad": "needs SQuAD v2 downloaded from the web at run time",
    "qa_hotpot": "needs HotpotQA downloaded from the web at run time",
}
MAX_SAMPLES = 500  # lm-eval's RULER generators make 500 prompts per task and length


def check_mode(mode: str, stride: int | None = None) -> str:
    """A known mode, and a stride only where windows slide (same_target windows end at fixed places)."""
    if mode not in PERPLEXITY_MODES:
        raise PosEncError(f"unknown perplexity mode {mode!r}; choose from "
                          + "; ".join(f"{name} ({what})" for name, what in PERPLEXITY_MODES.items()))
    if stride is not None and mode != "sliding":
        raise PosEncError(f"a stride applies to the sliding perplexity mode, not {mode!r}; pass mode='sliding' "
                          f"(--ppl-mode sliding) with it, or no stride")
    return mode


def parse_tasks(names: Sequence[str]) -> list[str]:
    """RULER task names (all synthetic ones when empty), in the order given; others are a PosEncError."""
    tasks = [n.strip() for n in names if n.strip()] or list(RULER_TASKS)
    for task in tasks:
        if task in NOT_OFFLINE:
            raise PosEncError(f"RULER task {task!r} is not offline: it {NOT_OFFLINE[task]}; "
                              f"the offline tasks are {', '.join(RULER_TASKS)}")
        if task not in RULER_TASKS:
            raise PosEncError(f"unknown RULER task {task!r}; choose from {', '.join(RULER_TASKS)} "
                              f"(e.g. --suite ruler:niah_single_1,vt; plain 'ruler' runs them all)")
    return list(dict.fromkeys(tasks))


def parse_suites(names: Sequence[str]) -> list[str]:
    """Suite names (or aliases) to suites, in the order given; unknown names are a PosEncError.

    `ruler` is every offline RULER task; `ruler:<task>` a subset, and the names after it that are not
    suites are more of its tasks (`ruler:niah_single_1,vt,ppl`); the suite is kept as `ruler:<tasks>`.
    """
    suites: list[str] = []
    named: list[str] | None = None  # the tasks of the ruler suite, while its names are being read
    for name in (ALIASES.get(n.strip(), n.strip()) for n in names if n.strip()):
        if name == "ruler" or name.startswith("ruler:"):
            named = [task for task in name.partition(":")[2].split(",") if task]
            suites.append("ruler")
        elif named is not None and name not in SUITES:
            named.append(name)
        elif name in SUITES:
            suites.append(name)
        else:
            raise PosEncError(f"unknown suite {name!r}; choose from {', '.join(SUITES)} (ppl = perplexity; "
                              f"ruler:<task>,<task> for some RULER tasks)")
    if not suites:
        raise PosEncError(f"no suite given; choose from {', '.join(SUITES)} (ppl = perplexity)")
    if named is not None:
        suites[suites.index("ruler")] = _ruler_suite(named)
    return suites


def check_model_kind(suites: Sequence[str], encoder_decoder: bool, model: str) -> None:
    """Encoder-decoders take the seq2seq suites only, other models every suite but those; `model` names
    the model in the error."""
    if encoder_decoder:
        bad = [s for s in suites if s not in SEQ2SEQ_SUITES]
        if bad:
            raise PosEncError(f"{model} is an encoder-decoder model: it takes the suites {', '.join(SEQ2SEQ_SUITES)} "
                              f"(input -> output pairs), not {', '.join(bad)}")
    elif bad := [s for s in suites if s in SEQ2SEQ_SUITES]:
        raise PosEncError(f"{model} is not an encoder-decoder model: the suites {', '.join(bad)} need one "
                          "(AutoModelForSeq2SeqLM: T5, BART, ...); a causal LM takes copy, reverse, addition")


def _ruler_suite(tasks: list[str]) -> str:
    chosen = parse_tasks([t for t in tasks if t])
    return "ruler" if chosen == list(RULER_TASKS) else "ruler:" + ",".join(chosen)
