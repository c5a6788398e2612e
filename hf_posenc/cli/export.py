"""`hf-posenc export`: a (patched) model as a GGUF file that llama.cpp runs with the same positions."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import PosEncError
from .checks import model_folder

DTYPES = ("f32", "f16", "bf16", "q8_0")  # hf_posenc.serving.gguf.export.DTYPES, without importing torch for --help


def make_parser(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Write MODEL as one GGUF file for llama.cpp, with the positional scheme it was patched "
                          "with (as a llama.cpp architecture and its keys), or refuse by name -- scheme, option, "
                          "what llama.cpp lacks -- before anything is written. docs/guide/gguf.md has the table.")
    parser.epilog = ("examples:\n"
                     "  hf-posenc export out/smollm2-yarn2 --gguf out/smollm2-yarn2.gguf\n"
                     "  hf-posenc export out/smollm2-alibi --gguf alibi-q8.gguf --dtype q8_0\n"
                     "then run it in llama.cpp: the README's set-up has it in .venv-llamacpp (`make llamacpp` builds\n"
                     "it alone); the script loads the file with its own context and prints a greedy completion:\n"
                     "  .venv-llamacpp/bin/python scripts/llamacpp-generate out/smollm2-yarn2.gguf \"In the beginning\"\n"
                     "or, where you have llama.cpp's own CLI:\n"
                     "  llama-cli -m out/smollm2-yarn2.gguf -c 16384")
    parser.add_argument("model", metavar="MODEL", help="a folder hf-posenc patch / train or save_pretrained wrote, "
                                                        "or 'smollm2'")
    parser.add_argument("--gguf", required=True, metavar="OUT.gguf", help="the GGUF file to write (new)")
    parser.add_argument("--dtype", choices=DTYPES, default="f32", help="type of the 2-D weights (norms stay f32)")
    parser.add_argument("--overwrite", action="store_true", help="replace OUT.gguf if hf-posenc wrote it")


def check(args: argparse.Namespace) -> None:
    """The model folder, the output path, then what llama.cpp computes of the config's positions (scheme and
    options, or a refusal naming them): all before any weight or tokenizer is read."""
    model_folder(args.model, "MODEL")
    out = Path(args.gguf)
    if out.is_dir():
        raise PosEncError(f"--gguf {args.gguf} is a folder; give a new .gguf file name")
    if not out.parent.is_dir():
        raise PosEncError(f"--gguf {args.gguf}: the folder {out.parent} does not exist")
    if out.exists() and not args.overwrite:
        raise PosEncError(f"--gguf {args.gguf} exists; choose a new name, or pass --overwrite to replace a GGUF "
                          "hf-posenc wrote")
    from ..loading import load_config
    from ..serving.gguf.targets import target_of

    target_of(load_config(args.model))


def main(args: argparse.Namespace) -> int:
    from ..progress import waiting

    with waiting("export: importing torch and transformers"):
        from ..serving.gguf.export import export_gguf

    with waiting(f"exporting {args.model} to {args.gguf}"):
        path = export_gguf(args.model, args.gguf, dtype=args.dtype, overwrite=args.overwrite)
    print(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB)")
    return 0
