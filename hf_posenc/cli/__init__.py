"""`hf-posenc`: the dispatcher. Each subcommand is a module here with `make_parser(parser)`,
optionally `prepare(argv)` (what must happen before its parser is built: eval imports suites of your own),
optionally `check(args)` (every check that loads no model: a failure there is a usage error, exit
2, and nothing has been written) and `main(args) -> int`; feature modules parse no argv.

Only the module of the command being run is imported, and none for `hf-posenc --help`: torch and
transformers load when a command needs them, so help and `list` start at once.

Exit codes: 0 done, 1 failed while running, 2 usage error (argparse or `check`), 130 interrupted
(Ctrl-C; says what was saved), 141 broken pipe (`hf-posenc list --json | head`; nothing printed).
Every failure is one line naming what went wrong; `--debug` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path
from types import ModuleType

from ..errors import PosEncError

# subcommand -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "list": ("hf_posenc.cli.list_", "schemes, architectures and the support matrix"),
    "patch": ("hf_posenc.cli.patch", "patch a model and save it"),
    "demo": ("hf_posenc.cli.demo", "end-to-end demo on SmolLM2-135M-Instruct (offline)"),
    "eval": ("hf_posenc.cli.eval_", "evaluate a (patched) model: perplexity by length, passkey, sentiment"),
    "inspect": ("hf_posenc.cli.inspect", "subspace geometry, four-term attention, encoding plots"),
    "train": ("hf_posenc.cli.train", "run a fine-tuning recipe through accelerate"),
    "recipes": ("hf_posenc.cli.recipes", "list the shipped recipes, or copy one to edit"),
    "card": ("hf_posenc.cli.card", "write a model card for a run folder"),
    "push": ("hf_posenc.cli.push", "upload a run folder to the Hub"),
    "export": ("hf_posenc.cli.export", "write a patched model as a GGUF file for llama.cpp, or refuse by name"),
    "doctor": ("hf_posenc.cli.doctor", "check the installed transformers against every family (after an upgrade)"),
}
DEBUG_HELP = "show the full traceback of an error instead of one line"


def _add(parser: argparse.ArgumentParser, command: str, argv: list[str] | None) -> ModuleType:
    module = importlib.import_module(SUBCOMMANDS[command][0])
    if hasattr(module, "prepare"):
        module.prepare(argv)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    module.make_parser(parser)
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
    parser.set_defaults(_module=module, _prog=parser.prog)
    return module


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The `hf-posenc` parser; only the subcommand named in `argv` gets its full parser (and its
    module imported). Without `argv`, every subcommand's."""
    parser = argparse.ArgumentParser(
        prog="hf-posenc",
        description="Swap the positional encoding of a transformers model, fine-tune, evaluate, inspect and publish it.",
        epilog="examples:\n  hf-posenc list\n  hf-posenc demo\n  hf-posenc patch smollm2 yarn --opt factor=4 --out out/yarn4",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = next((a for a in argv if a in SUBCOMMANDS), None) if argv is not None else None
    for name, (_, help_text) in SUBCOMMANDS.items():
        command = sub.add_parser(name, help=help_text)
        if argv is None or name == chosen:
            _add(command, name, argv)
    return parser


def _interrupted(args: argparse.Namespace) -> str:
    """What an interrupted command leaves on disk, from the command's own `saved(args)` if it has one."""
    saved = getattr(args._module, "saved", None)
    if saved is not None:
        return saved(args)
    out = getattr(args, "out", None)
    return f"partial output in {out}" if out and Path(out).is_dir() and any(Path(out).iterdir()) else "nothing was saved"


def _left(args: argparse.Namespace) -> str:
    """What a run that failed left and how to go on (the command's `saved`), said on the error's one line; never
    an error of its own in place of the run's."""
    saved = getattr(args._module, "saved", None)
    try:
        return saved(args) if saved is not None else ""
    except Exception:
        return ""


def _fail(prog: str, err: BaseException, left: str = "") -> None:
    what = str(err) if isinstance(err, (PosEncError, OSError)) else f"{type(err).__name__}: {err}"
    print(f"{prog}: error: {what}" + (f" ({left})" if left else ""), file=sys.stderr)
    if not isinstance(err, PosEncError):
        print(f"{prog}: (run with --debug for the traceback)", file=sys.stderr)


def _run(parser: argparse.ArgumentParser, argv: list[str]) -> int:
    """Parse, check, run; every error becomes one line and an exit code (see the module docstring)."""
    if not sys.stderr.isatty():  # transformers' and the Hub's bars too (our own use tqdm's disable=None)
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    args, extra = parser.parse_known_args(argv)
    if extra and not hasattr(args, "overrides"):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:
        args.overrides = extra
    debug, prog, module = getattr(args, "debug", False), args._prog, args._module
    stage = "check"
    try:
        if hasattr(module, "check"):
            module.check(args)
        stage = "main"
        code = int(module.main(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return code
    except KeyboardInterrupt:
        print(f"\n{prog}: interrupted; {_interrupted(args)}", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (`| head`): say nothing, and keep Python from complaining at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as err:
        if debug:
            raise
        _fail(prog, err, _left(args) if stage == "main" else "")
        return 2 if stage == "check" and isinstance(err, PosEncError) else 1


def main(argv: list[str] | None = None) -> int:
    """Entry point of `hf-posenc`."""
    argv = sys.argv[1:] if argv is None else argv
    return _run(build_parser(argv), argv)
