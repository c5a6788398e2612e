"""`hf-posenc push`: upload a folder to the Hub as a repo that reloads patched; the folder is never changed."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import PosEncError
from ..folders import check_out, writing
from .checks import model_folder, repo_id


def make_parser(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Upload DIR to the Hub as REPO_ID with a model card and the remote code that makes "
                          "`trust_remote_code=True` reload the patch. DIR itself is never modified.")
    parser.epilog = ("examples:\n"
                     "  hf-posenc push out/smollm2-yarn4 me/smollm2-yarn4 --base-model HuggingFaceTB/SmolLM2-135M-Instruct\n"
                     "  hf-posenc push runs/minilm-rope me/minilm-rope --private\n"
                     "  hf-posenc push out/smollm2-yarn4 me/smollm2-yarn4 --dry-run /tmp/staged  # look first\n"
                     "  hf-posenc push out/smollm2-yarn4 me/smollm2-yarn4 --gguf out/smollm2-yarn4.gguf  # + llama.cpp")
    parser.add_argument("dir", metavar="DIR",
                        help="a folder saved after hf_posenc.patch (model.save_pretrained) or a training run")
    parser.add_argument("repo_id", metavar="REPO_ID", help="owner/name on the Hub")
    parser.add_argument("--base-model", help="Hub id of the model it derives from (for the card)")
    parser.add_argument("--private", action="store_true", help="create the repo private")
    parser.add_argument("--token", help="Hub token (default: HF_TOKEN or the one `hf auth login` stored)")
    parser.add_argument("--message", default="Upload model patched with hf-posenc", help="commit message")
    parser.add_argument("--dry-run", metavar="OUT", help="write the repo to the new folder OUT and upload nothing")
    parser.add_argument("--gguf", metavar="FILE", help="also upload FILE, a GGUF `hf-posenc export` wrote of DIR, and "
                                                       "name it and its llama.cpp command in the card")


def check(args: argparse.Namespace) -> None:
    """The repo id (huggingface_hub's own rule) and the folder before the token, and all before any request."""
    repo_id(args.repo_id, "REPO_ID")
    if not Path(args.dir).is_dir():
        raise PosEncError(f"DIR {args.dir} is not a folder; give a folder written by model.save_pretrained, "
                          "hf-posenc patch or hf-posenc train")
    if not (Path(args.dir) / "config.json").is_file():
        raise PosEncError(f"{args.dir} has no config.json: give a folder written by model.save_pretrained, "
                          "hf-posenc patch or hf-posenc train")
    model_folder(args.dir, "DIR")
    if args.gguf is not None and not Path(args.gguf).is_file():
        raise PosEncError(f"--gguf {args.gguf} is not a file; write it with `hf-posenc export DIR --gguf FILE`")
    if args.dry_run:
        if Path(args.dry_run).exists():
            raise PosEncError(f"--dry-run {args.dry_run} already exists; give a new folder")
        check_out(args.dry_run, overwrite=False, flag="--dry-run", sources={"DIR": args.dir}, command="push --dry-run")
        return
    from huggingface_hub import get_token

    if not (args.token or get_token()):
        from ..hub import NO_TOKEN

        raise PosEncError(NO_TOKEN)


def main(args: argparse.Namespace) -> int:
    from ..hub import export, push

    if args.dry_run:
        # hard links where the file system allows (517 MB of SmolLM2 weights copied otherwise); the files export
        # writes (card, config, remote code) are new files, never written through a link
        with writing(args.dry_run, "push --dry-run", [args.dir]) as out:  # marked: not part of what is uploaded
            export(args.dir, out, base_model=args.base_model, repo_id=args.repo_id, link=True, gguf=args.gguf)
        print(f"staged {args.repo_id} in {args.dry_run}; nothing uploaded (the weights are hard links to {args.dir}'s "
              "where the file system allows: replace a staged file rather than edit it in place)")
        return 0
    url = push(args.dir, args.repo_id, token=args.token, private=args.private, commit_message=args.message,
               base_model=args.base_model, gguf=args.gguf)
    print(f"pushed {args.dir} to {url}")
    return 0
