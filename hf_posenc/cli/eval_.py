"""`hf-posenc eval`: run evaluation suites on a (patched) model into results.json, or compare results files."""

from __future__ import annotations

import argparse
import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import PosEncError
from ..folders import check_out, clear_out, finished, incomplete
from ..models import display_name
from ..progress import waiting
from .arguments import float_list, int_list, layer_list, parse_options, scheme_config
from .checks import at_least, check_model_takes, layers_fit, model_folder, options_fit
from .cost import announce
from .launch import accelerate_config, launch, launch_settings
from .threads import limited_threads

if TYPE_CHECKING:
    from ..evaluation import SuiteSettings

SUITE_NAMES = ("perplexity (ppl), passkey, rotten_tomatoes, sst2 (GLUE's, online), copy, reverse, addition, "
              "ruler (RULER's offline tasks; ruler:niah_single_1,vt,... for some); encoder-decoder models: "
              "seq2seq_copy, seq2seq_reverse, seq2seq_addition (input -> output pairs, exact match by length)")


def make_parser(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Evaluate a (patched) model: perplexity by length, passkey retrieval, sentiment, "
                          "length generalisation. Prints the results table and writes OUT/results.json.")
    parser.epilog = (
        "examples:\n"
        "  hf-posenc eval --model smollm2 --suite ppl,passkey --lengths 512,2048,8192 --out out/orig\n"
        "  hf-posenc eval --model smollm2 --patch yarn --opt factor=4 --suite ppl --lengths 512,16384 --out out/yarn4\n"
        "  hf-posenc eval --model ./my-patched-model --suite rotten_tomatoes --limit 500 --out out/sentiment\n"
        "  hf-posenc eval --model smollm2 --patch yarn --opt factor=2 --suite ruler --lengths 1024,4096 --out out/ruler\n"
        "  hf-posenc eval --model out/t5-tiny-rope --suite seq2seq_copy --task-lengths 8,16,32 --examples 50 --out out/s2s\n"
        "  hf-posenc eval --compare out/orig/results.json out/yarn4/results.json --out out/compare\n"
    )
    parser.add_argument("--model", help="'smollm2' (offline package model), a saved folder or a Hub id")
    parser.add_argument("--patch", dest="scheme", metavar="SCHEME", help="apply hf_posenc.patch(model, SCHEME) first")
    parser.add_argument("--opt", action="append", default=[], metavar="K=V", help="scheme option, repeatable (e.g. factor=4)")
    parser.add_argument("--layers", metavar="I,J,...", help="with --patch: only these attention layers take the scheme")
    parser.add_argument("--suite", default="perplexity,passkey", help=f"comma-separated, from: {SUITE_NAMES}")
    parser.add_argument("--lengths", default="512,1024,2048", help="context lengths in tokens (perplexity, passkey)")
    parser.add_argument("--text", default="kjv", help="long text for perplexity: 'kjv' (offline) or a datasets name")
    parser.add_argument("--text-config", default=None, help="datasets config of --text (e.g. wikitext-103-raw-v1)")
    parser.add_argument("--text-column", default="text", help="text column of a datasets --text")
    parser.add_argument("--stride", type=int, default=None, help="--ppl-mode sliding: window stride (default: the length)")
    parser.add_argument("--max-windows", type=int, default=4, help="perplexity windows per length (bounds the cost)")
    parser.add_argument("--ppl-mode", dest="perplexity_mode", default="same_target", metavar="MODE",
                        help="same_target (default): the same last --target-tokens tokens of windows ending at the "
                             "same places are scored at every length, so only the context grows; sliding: windows "
                             "from the start of the text (each length scores other tokens)")
    parser.add_argument("--target-tokens", type=int, default=None,
                        help="same_target: tokens scored per window (default: half the shortest length)")
    parser.add_argument("--batch-size", type=int, default=1, help="sequences per forward pass")
    parser.add_argument("--depths", default="0,0.25,0.5,0.75,1", help="passkey needle depths in [0, 1]")
    parser.add_argument("--trials", type=int, default=4,
                        help="passkey prompts per length and depth (default 4 x 5 depths = 20 per length)")
    parser.add_argument("--samples", type=int, default=20, help="RULER prompts per task and length")
    parser.add_argument("--gen-tokens", type=int, default=None,
                        help="RULER: cap the greedy answer at N tokens (default: each task's own, 30-128)")
    parser.add_argument("--task-lengths", default="2,4,8,16",
                        help="digits per example for copy/reverse/addition and their seq2seq_ suites")
    parser.add_argument("--examples", type=int, default=20,
                        help="examples per task length (copy/reverse/addition and their seq2seq_ suites)")
    parser.add_argument("--limit", type=int, default=None, help="sentiment suites: score only the first N sentences")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                        help="the dtype the model is loaded and scored in")
    parser.add_argument("--seed", type=int, default=0, help="seed of passkey keys, task examples and a random patch init")
    parser.add_argument("--out", required=True, help="new output folder (results.json, *.png)")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it holds earlier hf-posenc output")
    parser.add_argument("--no-baseline", action="store_true",
                        help="score only the patched model (by default the model unpatched is scored too, same settings)")
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
        from .. import results
        from ..evaluation.suites import differing_settings

        args.records = [results.load(path) for path in args.compare]  # a PNG or a missing file fails here
        differing_settings(args.records, args.mixed)
        return
    if not args.model:
        raise PosEncError("give --model (a folder, a Hub id or 'smollm2') or --compare RESULTS_JSON ...")
    at_least(args, max_windows=1, batch_size=1, trials=1, examples=1, limit=1, stride=1, seed=0, samples=1,
             gen_tokens=1)
    args.lengths = int_list(args.lengths, "length")
    args.depths, args.task_lengths = float_list(args.depths, "depth"), int_list(args.task_lengths, "task length")
    if any(not 0 <= depth <= 1 for depth in args.depths):
        raise PosEncError(f"--depths: passkey needle depths in [0, 1], got {args.depths}")
    if args.target_tokens is not None and not 0 < args.target_tokens < min(args.lengths):
        raise PosEncError(f"--target-tokens: the tokens scored per window must be in 1..{min(args.lengths) - 1} "
                          f"(below the shortest of --lengths), got {args.target_tokens}")
    args.options = parse_options(args.opt)
    args.config = scheme_config(args.scheme, args.options, args.layers)  # torch-free: a scheme mistake is refused at once
    if args.layers is not None:
        layers_fit(args.model, layer_list(args.layers), "--layers")
    options_fit(args.model, args.config)
    if args.accelerate_config is not None:
        args.launch = launch_settings(accelerate_config(args.accelerate_config))
    from ..evaluation.names import MAX_SAMPLES, check_mode, check_model_kind, parse_suites

    args.suites = parse_suites(args.suite.split(","))
    check_mode(args.perplexity_mode, args.stride)
    if any(s.startswith("ruler") for s in args.suites):
        if args.samples > MAX_SAMPLES:
            raise PosEncError(f"--samples: RULER makes {MAX_SAMPLES} prompts per task and length, got {args.samples}")
        if args.accelerate_config is not None:
            raise PosEncError("--suite ruler runs in one process (lm-eval's generate loop); drop --accelerate-config")
    model_folder(args.model, "--model")
    from ..loading import load_config

    config = load_config(args.model)
    encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
    check_model_kind(args.suites, encoder_decoder, f"--model {args.model!r} ({config.model_type})")
    args.task = "seq2seq" if encoder_decoder else "causal_lm"  # the class `load` builds
    check_model_takes(args.model, args.config)
    announce(args, config)  # every check passed: a long run is announced before the model loads


def main(args: argparse.Namespace) -> int:
    from ..evaluation import compare

    if args.compare:
        print(compare(args.compare, clear_out(args.out, "eval --compare", args.compare), records=args.records,
                      mixed=args.mixed))
        return 0
    if args.accelerate_config is not None:  # checked here, run in each launched process
        clear_out(args.out, "eval", [args.model], until_finished=True)
        code = launch(accelerate_config(args.accelerate_config), args.launch, ["eval", *_argv(args)], "evaluation")
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
        print(results.markdown(record.runs))
        if "perplexity" in record.settings["suite"]:
            print(results.scored_places(record.settings))
        if (original := original_model(args.model)) and any("its own weights" in run.label for run in record.runs):
            print(f"the baseline is {display_name(args.model)}'s own weights with its native positions, not the "
                  f"original model; to score the original ({original}) with the same settings: hf-posenc eval "
                  f"--model {original} ... --out OUT2, then hf-posenc eval --compare")
        print(f"wrote {Path(out) / 'results.json'} ({record.wall_time_s} s, {state.num_processes} process(es))")
    if not distributed:
        finished(out)
    return 0


def original_model(name: str) -> str | None:
    """The model a saved folder was trained or patched from, where the folder says (run.json's recipe, or its
    card's base_model); None for anything else."""
    import json

    from ..models import origin

    run = Path(name) / "run.json"
    if run.is_file():
        with contextlib.suppress(ValueError, AttributeError):
            return json.loads(run.read_text(encoding="utf-8"))["recipe"]["model"]["name_or_path"]
    return origin(name)[0] if Path(name).is_dir() else None


def suite_settings(args: argparse.Namespace, distributed: bool) -> SuiteSettings:
    """The checked flags as `run_suites` takes them."""
    from ..evaluation import SuiteSettings

    return SuiteSettings(
        args.suites, args.lengths, name=args.model, scheme=args.scheme, options=args.options, text=args.text,
        text_config=args.text_config, text_column=args.text_column, stride=args.stride, max_windows=args.max_windows,
        perplexity_mode=args.perplexity_mode, target_tokens=args.target_tokens, batch_size=args.batch_size,
        depths=args.depths, trials=args.trials, samples=args.samples, gen_tokens=args.gen_tokens,
        task_lengths=args.task_lengths, examples=args.examples, limit=args.limit, seed=args.seed, dtype=args.dtype,
        baseline=not args.no_baseline, distributed=distributed)


def saved(args: argparse.Namespace) -> str:
    path = Path(args.out) / "results.json"
    if args.compare or not incomplete(args.out, "eval"):
        return "nothing was saved"
    done = f"the suites that finished are in {path} (complete: false)" if path.is_file() else "no suite finished"
    return f"{done}; the same command run again replaces {args.out}, no --overwrite needed"
