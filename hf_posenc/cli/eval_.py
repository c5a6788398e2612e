"""`hf-posenc eval`: run evaluation suites on a (patched) model into results.json, or compare results files."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import PosEncError
from ..folders import MARKER, check_out, clear_out, finished, incomplete, read_marker, writing
from ..models import display_name
from ..progress import waiting
from .arguments import int_list, layer_list, parse_options, scheme_config
from .checks import at_least, check_model_takes, layers_fit, model_folder, options_fit
from .cost import announce
from .launch import accelerate_config, launch, launch_settings
from .suite_flags import add_suite_flags, import_suite_modules, suite_values
from .threads import limited_threads

if TYPE_CHECKING:
    from ..evaluation import SuiteSettings


def prepare(argv: list[str] | None) -> None:
    """Import the suites of your own (`--suite-module`, entry points) before the parser lists suites and flags."""
    import_suite_modules(argv)


def make_parser(parser: argparse.ArgumentParser) -> None:
    from ..evaluation.suite import suite_help

    parser.description = ("Evaluate a (patched) model: perplexity by length, passkey retrieval, sentiment, "
                          "length generalisation. Prints the results table and writes OUT/results.json.")
    parser.epilog = (
        "examples:\n"
        "  hf-posenc eval --model smollm2 --suite ppl,passkey --lengths 512,2048,16384 --out out/orig\n"
        "  hf-posenc eval --model smollm2 --patch yarn --opt factor=4 --suite ppl --lengths 512,2048,16384 --out out/yarn4\n"
        "  hf-posenc eval --model ./my-patched-model --suite rotten_tomatoes --sentiment.limit 500 --out out/sentiment\n"
        "  hf-posenc eval --model smollm2 --patch yarn --opt factor=2 --suite ruler --lengths 1024,4096 --out out/ruler\n"
        "  hf-posenc eval --model out/t5-tiny-rope --suite seq2seq_copy --synthetic.task-lengths 8,16,32 --synthetic.examples 50 --out out/s2s\n"
        "  hf-posenc eval --compare out/orig/results.json out/yarn4/results.json --out out/compare\n"
    )
    parser.add_argument("--model", help="'smollm2' (offline package model), a saved folder or a Hub id")
    parser.add_argument("--patch", dest="scheme", metavar="SCHEME", help="apply hf_posenc.patch(model, SCHEME) first")
    parser.add_argument("--opt", action="append", default=[], metavar="K=V", help="scheme option, repeatable (e.g. factor=4)")
    parser.add_argument("--layers", metavar="I,J,...", help="with --patch: only these attention layers take the scheme")
    parser.add_argument("--suite", default="perplexity,passkey", help=f"comma-separated suites, from: {suite_help()}")
    parser.add_argument("--suite-module", action="append", default=[], metavar="MODULE_OR_FILE",
                        help="import a suite of your own first (a module name or a .py file that calls "
                             "register_suite), repeatable; its flags then show here too")
    parser.add_argument("--lengths", default="512,1024,2048", help="context lengths in tokens (perplexity, passkey, ruler)")
    parser.add_argument("--batch-size", type=int, default=1, help="sequences per forward pass")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                        help="the dtype the model is loaded and scored in")
    parser.add_argument("--seed", type=int, default=0, help="seed of passkey keys, task examples and a random patch init")
    add_suite_flags(parser)  # one argument group per suite settings class, from its fields
    parser.add_argument("--out", required=True, help="new output folder (results.json, *.png)")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it holds earlier hf-posenc output")
    parser.add_argument("--no-baseline", action="store_true",
                        help="score only the patched model (by default the model unpatched is scored too, same "
                             "settings, and the original a trained or patched folder came from, where it says)")
    parser.add_argument("--compare", nargs="+", metavar="RESULTS_JSON", help="merge results files into a table + plots")
    parser.add_argument("--mixed", action="store_true",
                        help="with --compare: allow runs whose settings differ (the table flags them)")
    parser.add_argument("--accelerate-config", dest="accelerate_config", default=None,
                        help="split the windows and prompts over the processes of this accelerate config (name, "
                             "e.g. ddp or cpu_2proc, or a path); one results file, as one process would write")
    parser.set_defaults(_parser=parser)  # to pass the options on to the launched processes


def _argv(args: argparse.Namespace) -> list[str]:
    """The options of this evaluation as command-line arguments again, for the launched processes: the
    folder is cleared here once, so they take it with --overwrite."""
    argv: list[str] = ["--overwrite"]
    for action in args._parser._actions:
        value = getattr(args, action.dest, None)
        skip = ("help", "accelerate_config", "overwrite")
        if not action.option_strings or action.dest in skip or value == action.default:
            continue
        flag = action.option_strings[-1]
        if action.nargs == 0:  # store_true and the like
            argv.append(flag)
        elif isinstance(action, argparse._AppendAction):
            argv += [item for v in value for item in (flag, str(v))]
        elif isinstance(value, list) and action.nargs is None:  # a comma list that check() parsed
            argv += [flag, ",".join(map(str, value))]
        else:
            argv += [flag, *map(str, value if isinstance(value, list) else [value])]
    return argv


def check(args: argparse.Namespace) -> None:
    """Torch-free first (folders, every flag's domain, the scheme and its options, the accelerate
    config), then the suite names, the model's files and what its config.json says it takes."""
    sources = {"--model": args.model, **{f"--compare {path}": path for path in args.compare or []}}
    check_out(args.out, args.overwrite, sources=sources, command="eval --compare" if args.compare else "eval")
    if args.compare:
        from ..evaluation import load_results
        from ..evaluation.comparing import differing_settings

        args.records = [load_results(path) for path in args.compare]  # a PNG or a missing file fails here
        differing_settings(args.records, args.mixed)
        return
    if not args.model:
        raise PosEncError("give --model (a folder, a Hub id or 'smollm2') or --compare RESULTS_JSON ...")
    at_least(args, batch_size=1, seed=0)
    args.lengths = int_list(args.lengths, "length")
    args.options = parse_options(args.opt)
    args.config = scheme_config(args.scheme, args.options, args.layers)  # torch-free: a scheme mistake is refused at once
    if args.layers is not None:
        layers_fit(args.model, layer_list(args.layers), "--layers")
    options_fit(args.model, args.config)
    if args.accelerate_config is not None:
        args.launch = launch_settings(accelerate_config(args.accelerate_config))
    from ..evaluation.suite import check_model_kind, check_one_process, parse_suites

    args.suites = parse_suites(args.suite.split(","))
    args.values = suite_values(args, args.suites)  # every flag in its domain, the suites run checked
    if args.accelerate_config is not None:
        check_one_process(args.suites, "drop --accelerate-config")
    model_folder(args.model, "--model")
    from ..loading import load_config

    config = load_config(args.model)
    encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
    check_model_kind(args.suites, encoder_decoder, f"--model {args.model!r} ({config.model_type})")
    args.task = "seq2seq" if encoder_decoder else "causal_lm"  # the class `load` builds
    check_model_takes(args.model, args.config)
    args.original = None if args.no_baseline else reachable_original(args.model)
    # an untrained patched folder unpatched is its original: the plan shows one row for both (scoring checks it)
    args.same_as_original = args.original is not None and args.scheme is None and \
        (read_marker(Path(args.model)) or {}).get("command") == "patch"
    announce(args, config)  # every check passed: a long run is announced before the model loads


def main(args: argparse.Namespace) -> int:
    from ..evaluation import compare

    if args.compare:
        with writing(args.out, "eval --compare", args.compare) as out:
            table = compare(args.compare, out, records=args.records, mixed=args.mixed)
        print(table)
        return 0
    if args.accelerate_config is not None:  # checked here, run in each launched process
        clear_out(args.out, "eval", [args.model], until_finished=True)
        code = launch(accelerate_config(args.accelerate_config), args.launch, ["hf_posenc.cli", "eval", *_argv(args)],
                      "evaluation")
        if code == 0:
            finished(args.out)
        return code
    # a launched process (WORLD_SIZE > 1) keeps the threads its launcher gave it
    with limited_threads("eval: importing torch and transformers", active=os.environ.get("WORLD_SIZE", "1") == "1"):
        return _evaluate(args)


def _evaluate(args: argparse.Namespace) -> int:
    """One process's evaluation (alone, or its share under `accelerate launch`): load, patch, score, write."""
    import torch

    from .. import results
    from ..evaluation import run_suites
    from ..evaluation.processes import join
    from ..loading import inference_device_map, load

    state = join()  # one process, or this one's place in an `accelerate launch`
    torch.manual_seed(args.seed)  # a patch initialised at random (t5 init_std) is the same in every process and run
    distributed = state.num_processes > 1
    with waiting(f"loading {display_name(args.model)}", show=state.is_main_process):
        model, tokenizer = load(args.model, task=args.task, dtype=getattr(torch, args.dtype),
                                device_map=inference_device_map(state.device if distributed else None))
    if args.config is not None:
        from ..patching import patch

        patch(model, args.config)
    # launched: cleared (and marked) once, before the launch
    out = Path(args.out) if distributed else clear_out(args.out, "eval", [args.model], until_finished=True)
    record = run_suites(model, tokenizer, suite_settings(args, distributed), out)
    if state.is_main_process:
        print(results.markdown(record.runs, record.tables()))
        for note in record.notes():
            print(note)
        print(f"wrote {Path(out) / 'results.json'} ({record.wall_time_s} s, {state.num_processes} process(es))")
    if not distributed:
        finished(out)
    return 0


def original_model(name: str) -> tuple[str, str] | None:
    """(the model a saved folder was trained or patched from, the record that says so): run.json's recipe, the
    marker `hf-posenc patch` wrote, or the card's base_model; None for anything else."""
    import json

    from ..models import origin

    folder = Path(name)
    if not folder.is_dir():
        return None
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
        return json.loads((folder / "run.json").read_text(encoding="utf-8"))["recipe"]["model_name_or_path"], \
            "its run.json"
    if (marker := read_marker(folder)) and marker.get("command") == "patch" and marker.get("sources"):
        return str(marker["sources"][0]), f"its {MARKER}, written by hf-posenc patch"
    base = origin(name)[0]
    return (base, "its model card's base_model") if base else None


def reachable_original(name: str) -> str | None:
    """The original model of a saved folder, to score as a baseline row, where it can be read now (a package
    model, a folder, a Hub id in the local cache or, online, on the Hub); else None, said in one line."""
    found = original_model(name)
    if found is None:
        return None
    original, where = found
    try:
        model_folder(original, "the original model")
    except PosEncError as err:
        reason = str(err).removeprefix("the original model: ").partition("; give ")[0]  # the advice is --model's
        if "WORLD_SIZE" not in os.environ:  # once, not again in each process --accelerate-config starts
            print(f"eval: not scoring the original model {original} ({where} names it) beside {Path(name).name}'s "
                  f"own weights: {reason}; where it can be read, `hf-posenc eval --model {original}` with the same "
                  f"settings and then `--compare` puts them side by side", file=sys.stderr, flush=True)
        return None
    return original


def suite_settings(args: argparse.Namespace, distributed: bool) -> SuiteSettings:
    """The checked flags as `run_suites` takes them."""
    from ..evaluation import SuiteSettings

    return SuiteSettings(args.suites, args.lengths, name=args.model, scheme=args.scheme, options=args.options,
                         batch_size=args.batch_size, seed=args.seed, dtype=args.dtype, baseline=not args.no_baseline,
                         original=args.original, distributed=distributed, **args.values)


def saved(args: argparse.Namespace) -> str:
    path = Path(args.out) / "results.json"
    if args.compare or not incomplete(args.out, "eval"):
        return "nothing was saved"
    done = f"the suites that finished are in {path} (complete: false)" if path.is_file() else "no suite finished"
    return f"{done}; the same command run again replaces {args.out}, no --overwrite needed"
