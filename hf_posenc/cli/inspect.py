"""`hf-posenc inspect`: subspace geometry, the four attention terms and the encoding of a model, as
inspect.json and PNG plots (`hf_posenc.analysis`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import PosEncError
from ..models import NAMED_MODELS, display_name
from ..folders import check_out, writing
from .checks import at_least, check_model_takes, model_folder

DEFAULT_TEXT = (
    "Positional encodings tell a transformer where each word stands. The original model added a fixed "
    "sinusoidal code to the word embeddings; later models learned a table of position vectors, and newer "
    "ones rotate queries and keys instead, so that attention depends on how far apart two words are."
)


def make_parser(parser: argparse.ArgumentParser) -> None:
    parser.description = "Look at positions inside a model: subspace geometry, the four attention terms, the encoding."
    parser.epilog = (
        "examples:\n"
        "  hf-posenc inspect minilm --out runs/inspect_minilm\n"
        "  hf-posenc inspect smollm2 --out runs/inspect_smollm2 --text \"The cat sat on the mat.\"\n"
        "  hf-posenc inspect ./my-bert --out runs/inspect --top-k 128\n"
        f"named offline models: {'; '.join(f'{k} = {v[3]} ({v[4]})' for k, v in NAMED_MODELS.items())}"
    )
    parser.add_argument("model", metavar="MODEL", help=f"a model folder, a Hub id, or {' / '.join(NAMED_MODELS)}")
    parser.add_argument("--out", required=True, help="new output folder for inspect.json and the PNG plots")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it holds earlier hf-posenc output")
    parser.add_argument("--text", default=DEFAULT_TEXT, help="text for the attention analyses (default: a short paragraph)")
    parser.add_argument("--top-k", type=int, default=None,
                        help="token subspace dimension (default: principal directions holding 90%% of the energy)")
    parser.add_argument("--pos-dim", type=int, default=None,
                        help="position subspace dimension (default: 90%% of the position energy)")
    parser.add_argument("--seeds", type=int, default=5, help="random subspaces for the baseline (default 5)")


def check(args: argparse.Namespace) -> None:
    check_out(args.out, args.overwrite, sources={"MODEL": args.model}, command="inspect")
    at_least(args, top_k=1, pos_dim=1, seeds=2)  # the random baseline reports a std: two subspaces at least
    if not args.text.strip():
        raise PosEncError("--text is empty; give a sentence or more for the attention analyses")
    model_folder(args.model, "MODEL")
    check_model_takes(args.model, None)


def main(args: argparse.Namespace) -> int:
    import torch

    from ..analysis import inspect_model
    from ..loading import load

    # the checkpoint's own class keeps its weight names; every analysis uses `model.base_model`
    model, tokenizer = load(args.model, task="saved", dtype=torch.float32)
    name = display_name(args.model)
    input_ids = tokenizer(args.text, return_tensors="pt")["input_ids"]
    with writing(args.out, "inspect", [args.model]) as out:
        result = inspect_model(model, input_ids, out, name=name, top_k=args.top_k, pos_dim=args.pos_dim,
                               seeds=args.seeds)
    print(f"{name} ({result['model_type']}, {result['positions']} positions), text of {result['num_tokens']} tokens")
    print(result["summary"])
    print(f"wrote {Path(args.out) / 'inspect.json'} and {', '.join(result['plots']) or 'no plots'}")
    return 0
