"""Names the suites take (RULER tasks, perplexity modes) and their checks: no torch, so the command line
refuses a typo at once, before anything heavy is imported. The suite names are the registry's (`suite.py`)."""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import PosEncError

# RULER's synthetic tasks (Hsieh et al. 2024) as lm-eval 0.4.13 ships them; one metric table each.
RULER_TASKS = ("niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
               "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe")

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
# our RULER task name -> lm-eval's (lm_eval/tasks/ruler/*.yaml)
LM_EVAL_NAMES: dict[str, str] = {name: {"vt": "ruler_vt", "cwe": "ruler_cwe", "fwe": "ruler_fwe"}.get(name, name)
                                 for name in RULER_TASKS}
MAX_SAMPLES = 500  # lm-eval's RULER generators make 500 prompts per task and length
HAYSTACK = "kjv"  # the prose of RULER's essay haystack, a `hf_posenc.data.long_text` name (see ruler.py)


def default_target(lengths: Sequence[int]) -> int:
    """Target tokens per window when none is given: half the shortest context, so every target has context."""
    return max(1, min(lengths) // 2)


def check_mode(mode: str, stride: int | None = None) -> str:
    """A known mode, and a stride only where windows slide (same_target windows end at fixed places)."""
    if mode not in PERPLEXITY_MODES:
        raise PosEncError(f"unknown perplexity mode {mode!r}; choose from "
                          + "; ".join(f"{name} ({what})" for name, what in PERPLEXITY_MODES.items()))
    if stride is not None and mode != "sliding":
        raise PosEncError(f"a stride applies to the sliding perplexity mode, not {mode!r}; pass mode='sliding' "
                          f"(--perplexity.mode sliding) with it, or no stride")
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
