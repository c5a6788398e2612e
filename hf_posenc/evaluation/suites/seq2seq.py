"""`seq2seq_copy`, `seq2seq_reverse`, `seq2seq_addition`: the synthetic tasks as input -> output pairs for
encoder-decoders (`hf_posenc.data.seq2seq_pairs`), exact match by task length; the only suites those take."""

from __future__ import annotations

from collections.abc import Iterator

from ..suite import Cell, Metric, Scoring, Suite, register_suite
from .synthetic import LENGTH_GENERALIZATION, TASKS, SyntheticData, TaskSettings, exact_match

PREFIX = "seq2seq_"


class Seq2SeqTask(Suite):
    Settings = TaskSettings
    group = "synthetic"
    measured_by = ("examples", "seed")
    encoder_decoder = True
    order = 90

    def __init__(self, task: str) -> None:
        self.task, self.name = task, f"{PREFIX}{task}"
        self.help = f"{task} as input -> output pairs (encoder-decoders), exact match by task length"
        self.metrics = {self.name: Metric(("exact_match",), "digits", "exact_match", task=(
            "text2text-generation", "Length generalisation (encoder-decoder)"), dataset=SyntheticData(self.name),
            plot=LENGTH_GENERALIZATION)}

    def cells(self, scoring: Scoring, s: TaskSettings, argument: str) -> Iterator[Cell]:
        from ... import data
        from ..scoring import check_lengths
        from ..tasks import seq2seq_length_generalization

        for length in check_lengths(list(s.task_lengths), "task length"):
            pairs = data.seq2seq_pairs(self.task, length, s.examples, scoring.seed)
            scored = seq2seq_length_generalization(scoring.model, scoring.tokenizer, pairs,
                                                   batch_size=max(scoring.batch_size, 8), progress=scoring.progress,
                                                   distributed=scoring.distributed)
            yield self.name, length, exact_match(scored, len(pairs))


for _task in TASKS:
    register_suite(Seq2SeqTask(_task))
