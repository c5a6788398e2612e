"""`lm_eval:<task>,<task>`: any lm-evaluation-harness task by name, run by lm-eval itself on the in-memory
(patched) model (`hf_posenc.integrations.lm_eval.PosEncLM`), with the package's offline tasks (`posenc_kjv`,
`posenc_sentiment`, `posenc_passkey`; tag `posenc`) beside lm-eval's own. One table, keyed by task and metric.

lm-eval's own command line with the `hf-posenc` model type stays for lm-eval users
(`python -m hf_posenc.integrations.lm_eval`); this suite is the same tasks inside `hf-posenc eval`: one
results.json, the comparison table, the card. Rates whose per-sample scores are 0/1 (`BINARY`) carry n and a
95% Wilson interval; every other metric its value, lm-eval's standard error and the sample count.

Before the model loads, on hf-posenc's cached copy of lm-eval's task index (`integrations.lm_eval_index`), a task
is refused by name when lm-eval does not know it, when it is RULER's (the `ruler` suite runs those offline), or when
its data is a Hub dataset in no local cache and the Hub cannot be reached; each refusal names the tasks whose data is
here. Rows are the metrics lm-eval's `higher_is_better` names, not its counts (`sample_len`) or labels.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ...domains import at_least, option
from ...errors import PosEncError, did_you_mean
from ...integrations.lm_eval_index import check_data_here, leaf_configs, named, task_index, tasks_here
from ..names import LM_EVAL_NAMES, NOT_OFFLINE, RULER_TASKS
from ..suite import Cell, Metric, Scoring, Suite, register_suite

BINARY = ("acc", "acc_norm", "exact_match")  # lm-eval metrics that average 0/1 per-sample scores
# lm-eval's names of RULER's tasks: their generators need the model's tokenizer and a haystack from the Hub, which the
# `ruler` suite supplies offline (the QA tasks it refuses: they download their questions)
RULER_LM_EVAL = frozenset(LM_EVAL_NAMES.values()) | {f"ruler_{qa}" for qa in NOT_OFFLINE}
OFFLINE_RULER = f", and RULER's through --suite ruler:<task> ({', '.join(RULER_TASKS)})"


@dataclasses.dataclass(frozen=True)
class LmEvalSettings:
    """lm-eval tasks by name"""

    lm_eval_limit: int | None = option(None, "lm-eval: score only the first N documents of each task",
                                       at_least(1, int), flag="limit")
    num_fewshot: int | None = option(None, "lm-eval: few-shot examples per prompt (default: each task's own)",
                                     at_least(0, int))


def _dataset(key: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    task = key.split()[0]
    return {"dataset_type": task, "dataset_name": f"lm-evaluation-harness task {task}"}


@functools.cache
def task_manager() -> Any:
    """lm-eval's tasks and the package's offline ones (indexed once per process: it reads every task's YAML)."""
    from lm_eval.tasks import TaskManager

    from ...integrations.lm_eval import LM_EVAL_TASK_DIR

    return TaskManager(include_path=str(LM_EVAL_TASK_DIR))


class LmEval(Suite):
    name = "lm_eval"
    help = "lm-evaluation-harness tasks by name (lm_eval:<task>,<task>; the offline posenc_* tasks too)"
    Settings = LmEvalSettings
    metrics = {"lm_eval": Metric(("value",), "", "value", task=("text-generation", "lm-evaluation-harness"),
                                 dataset=_dataset)}
    measured_by = ("lm_eval_limit", "num_fewshot", "seed")
    one_process = "lm-eval's own loop"
    arguments = "lm-eval tasks"
    order = 60

    def argument(self, names: Sequence[str]) -> str:
        """Task names lm-eval knows, whose data is here or can be fetched: checked on hf-posenc's copy of lm-eval's
        task index (`integrations.lm_eval_index`), before a model loads or a result is written."""
        if not names:
            raise PosEncError("name the lm-eval tasks to run: --suite lm_eval:<task>,<task> (e.g. "
                              "lm_eval:posenc_kjv,posenc_sentiment)")
        index = task_index()
        for task in names:
            if task not in index:
                raise PosEncError(f"unknown lm-eval task {task!r}{did_you_mean(task, index)}; `lm-eval ls tasks` "
                                  f"lists them (data here: {named(tasks_here())}{OFFLINE_RULER})")
            leaves = {config.get("task") for config in leaf_configs([task], index)}
            if ruler := sorted(leaves & RULER_LM_EVAL):
                offline = [name for name in RULER_TASKS if LM_EVAL_NAMES[name] in ruler]
                run = "" if not offline else "; run --suite ruler" + (
                    "" if offline == list(RULER_TASKS) else f":{','.join(offline)}")
                raise PosEncError(f"lm-eval task {task!r} is RULER's ({named(ruler)}): its prompts are made with the "
                                  "model's tokenizer and a Hub haystack, which --suite ruler supplies offline for "
                                  f"{', '.join(RULER_TASKS)}{run}")
        check_data_here(names, OFFLINE_RULER)
        return ",".join(dict.fromkeys(names))

    def cells(self, scoring: Scoring, s: LmEvalSettings, argument: str) -> Iterator[Cell]:
        from lm_eval import simple_evaluate

        from ...integrations.lm_eval import PosEncLM
        from ...stats import rate_fields

        lm = PosEncLM(pretrained=scoring.model, tokenizer=scoring.tokenizer, batch_size=scoring.batch_size,
                      max_length=max(scoring.lengths))
        for task in argument.split(","):
            out = simple_evaluate(model=lm, tasks=[task], task_manager=task_manager(), limit=s.lm_eval_limit,
                                  num_fewshot=s.num_fewshot, random_seed=scoring.seed, numpy_random_seed=scoring.seed,
                                  torch_random_seed=scoring.seed, fewshot_random_seed=scoring.seed)
            for name, values in out["results"].items():
                n = int(out["n-samples"].get(name, {}).get("effective", 0))
                metrics = out["higher_is_better"].get(name, {})  # the task's metrics, not its counts and labels
                for key, value in values.items():
                    metric, _, kept = key.partition(",")
                    if metric not in metrics or not isinstance(value, (int, float)):
                        continue
                    cell: dict[str, Any] = {"value": value, "samples": n}
                    if metric in BINARY and n:
                        cell.update(rate_fields(round(value * n), n))
                    elif isinstance(values.get(f"{metric}_stderr,{kept}"), (int, float)):
                        cell["stderr"] = values[f"{metric}_stderr,{kept}"]
                    yield "lm_eval", f"{name} {metric}", cell


register_suite(LmEval())
