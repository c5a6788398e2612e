"""One module per site; each joins a scheme's maths to one model at the places its adapter names, and knows what
that asks of a model.

The scheme's `site` names the module: "input" -> `embedding` (a position-embedding module), "qk" -> `qk`
(rotations of q and k), "score" -> `score` (a bias on the attention scores), "attention" -> `logits` (the q.k
logits computed by the scheme), "none" -> `removal`. Each exports `needs(adapter, scheme)` (the mechanisms it
uses, which an adapter's gaps can refuse) and `install(model, entry, state, loop)`, which records every change
in `state` and adds what the layer-loop hook must pass down to `loop`; a site may name its `KIND` of positions,
its `TITLE` on a model card and the `PROBE` scheme standing for it in the self-check. `model` installs one entry
into one model, `layers` a per-layer map, `stacks` the stacks of a plan; a new site is a new module here.
"""

from __future__ import annotations

from .base import remove_hooks
from .entry import Entry, StackPlan
from .stacks import install
from .table import SITES, kind, needs, probe, probes, site_refusal, stacks_refusal, title


__all__ = ["SITES", "Entry", "StackPlan", "install", "kind", "needs", "probe", "probes", "remove_hooks", "site_refusal",
           "stacks_refusal", "title"]
