"""`hf-posenc eval`: run evaluation suites on a (patched) model into results.json, or compare results files."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from ..errors import PosEncError
from ..evaluation import SUITES, compare, run_suites
from ..evaluation.processes import join
from ..evaluation.suites import parse_suites
from ..loading import inference_device_map, load
from . import float_list, int_list, parse_options
from .train import accelerate_config, launch


def make_parser(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Evaluate a (patched) model: perplexity by length, passkey retrieval, sentiment, "
                          "length generalisation.")
    parser.epilog = (
        "examples:\n"
        "  hf-posenc eval --model smollm2 --suite ppl,passkey --lengths 512,2048,8192 --out out/orig\n"
        "  hf-posenc eval --model smollm2 --patch yarn --opt factor=4 --suite ppl --lengths 512,16384 --out out/yarn4\n"
        "  hf-posenc eval --model ./my-patched-model --suite rotten_tomatoes --limit 500 --out out/sentiment\n"
        "  hf-posenc eval --compare out/orig/results.json out/yarn4/results.json --out out/compare\n"
        "  hf-posenc eval --model smollm2 --suite ppl --lengths 4096 --accelerate-config ddp --out out/ddp\n"
        "  accelerate launch --config_file CFG -m hf_posenc.cli eval --model smollm2 --suite ppl --out out/ddp\n"
    )
    parser.add_argument("--model", help="'smollm2' (offline package model), a saved folder or a Hub id")
    parser.add_argument("--patch", dest="scheme", metavar="SCHEME", help="apply hf_posenc.patch(model, SCHEME) first")
    parser.add_argument("--opt", action="append", default=[], metavar="K=V", help="scheme option, repeatable (e.g. factor=4)")
    parser.add_argument("--suite", default="perplexity,passkey",
                        help=f"comma-separated, from: {', '.join(SUITES)} (ppl = perplexity; sst2 = GLUE's, online)")
    parser.add_argument("--lengths", default="512,1024,2048", help="context lengths in tokens (perplexity, passkey)")
    parser.add_argument("--text", default="kjv", help="long text for perplexity: 'kjv' (offline) or a datasets name")
    parser.add_argument("--text-config", default=None, help="datasets config of --text (e.g. wikitext-103-raw-v1)")
    parser.add_argument("--text-column", default="text", help="text column of a datasets --text")
    parser.add_argument("--stride", type=int, default=None, help="sliding-window stride (default: the length)")
    parser.add_argument("--max-windows", type=int, default=4, help="perplexity windows per length (bounds the cost)")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--depths", default="0,0.25,0.5,0.75,1", help="passkey needle depths in [0, 1]")
    parser.add_argument("--trials", type=int, default=2, help="passkey prompts per length and depth")
    parser.add_argument("--task-lengths", default="2,4,8,16", help="digits per example for copy/reverse/addition")
    parser.add_argument("--examples", type=int, default=20, help="examples per task length (copy/reverse/addition)")
    parser.add_argument("--limit", type=int, default=None, help="sentiment suites: score only the first N sentences")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="output folder (results.json, *.png)")
    parser.add_argument("--compare", nargs="+", metavar="RESULTS_JSON", help="merge results files into a table + plots")
    parser.add_argument("--accelerate-config", dest="accelerate_config", default=None,
                        help="split the windows and prompts over the processes of this accelerate config (name, "
                             "e.g. ddp or cpu_2proc, or a path); one results file, as one process would write")
    parser.set_defaults(_parser=parser)  # to pass the options on to the launched processes


def _argv(args: argparse.Namespace) -> list[str]:
    """The options of this evaluation as command-line arguments again, without --accelerate-config."""
    argv: list[str] = []
    for action in args._parser._actions:
        value = getattr(args, action.dest, None)
        if not action.option_strings or action.dest in ("help", "accelerate_config") or value == action.default:
            continue
        flag = action.option_strings[-1]
        if action.nargs == 0:  # store_true and the like
            argv.append(flag)
        elif isinstance(action, argparse._AppendAction):
            argv += [item for v in value for item in (flag, str(v))]
        else:
            argv += [flag, *map(str, value if isinstance(value, list) else [value])]
    return argv


def main(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if args.compare:
        print(compare(args.compare, out))
        return 0
    if not args.model:
        raise PosEncError("give --model (a folder, a Hub id or 'smollm2') or --compare RESULTS_JSON ...")
    suites = parse_suites(args.suite.split(","))
    lengths = int_list(args.lengths, "length")
    options = parse_options(args.opt)
    if options and not args.scheme:
        raise PosEncError("--opt needs --patch SCHEME to apply to")
    depths, task_lengths = float_list(args.depths, "depth"), int_list(args.task_lengths, "task length")
    if args.accelerate_config is not None:  # checked above, run in each launched process
        return launch(accelerate_config(args.accelerate_config), ["hf_posenc.cli", "eval", *_argv(args)],
                      "hf-posenc eval")
    state = join()  # one process, or this one's place in an `accelerate launch`
    torch.manual_seed(args.seed)  # a patch initialised at random (t5 init_std) is the same in every process and run
    distributed = state.num_processes > 1
    model, tokenizer = load(args.model, dtype=getattr(torch, args.dtype), scheme=args.scheme, options=options,
                            device_map=inference_device_map(state.device if distributed else None))
    record = run_suites(
        model, tokenizer, suites, lengths, out, name=args.model, scheme=args.scheme, options=options,
        text=args.text, text_config=args.text_config, text_column=args.text_column, stride=args.stride,
        max_windows=args.max_windows, batch_size=args.batch_size, depths=depths, trials=args.trials,
        task_lengths=task_lengths, examples=args.examples, limit=args.limit, seed=args.seed, distributed=distributed,
    )
    if state.is_main_process:
        print(f"wrote {out / 'results.json'} ({record.wall_time_s} s, {state.num_processes} process(es))")
    return 0
