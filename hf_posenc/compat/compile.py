"""What torch.compile must see of a patch.

A patch works through forward hooks on the model's own modules, and dynamo, by default, does not guard on hooks
(`torch._dynamo.config.skip_nnmodule_hook_guards`): a graph it compiled for one model of a class is replayed for
another of the same class whatever hooks that one carries. So after a stock (or differently patched) model was
compiled, a patched one of the same class silently ran without its patch: found on CUDA, where `generate` with a
static cache compiles the decoding forward by itself (nope on one layer of a Llama took the stock rotation there).
"""

from __future__ import annotations

import torch


def guard_hooks() -> None:
    """Make dynamo guard on module hooks from now on, and drop the graphs it compiled without those guards (they
    recompile on their next call). The one process-wide setting a patch changes; it costs a few guards a call."""
    import torch._dynamo  # already imported by transformers' modeling code: no import cost here

    if torch._dynamo.config.skip_nnmodule_hook_guards:
        torch._dynamo.config.skip_nnmodule_hook_guards = False
        torch._dynamo.reset()
