"""A tiny random model of every causal-LM model type registered in the installed transformers (built by
`hf_posenc.tiny`: one generic shrink plus per-type overrides), and the zoo's cells: checks of one model type."""

from __future__ import annotations

import copy
import dataclasses
import functools
import time
from typing import Any, Callable

import torch
import transformers
from transformers import AutoModelForCausalLM
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from hf_posenc import compat, sites
from hf_posenc.self_check import native_options
from hf_posenc.tiny import tiny_config, tiny_ids, tiny_model  # noqa: F401  (tiny_config: the zoo tests use it)


def model_types() -> list[str]:
    """Every causal-LM model type of the installed transformers."""
    return list(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def build(model_type: str, seed: int = 0, attn: str | None = None) -> torch.nn.Module:
    """A fresh tiny random causal LM of `model_type`, in eval mode."""
    return tiny_model(model_type, AutoModelForCausalLM, seed, attn)


def inputs(batch: int = 2, length: int = 12, seed: int = 1) -> torch.Tensor:
    return tiny_ids(batch, length, seed)


@dataclasses.dataclass
class Entry:
    model_type: str
    built: bool
    forward: bool
    build_s: float
    forward_s: float
    error: str | None = None


def survey(model_type: str) -> tuple[Entry, torch.nn.Module | None]:
    start = time.perf_counter()
    try:
        model = build(model_type)
    except Exception as exc:  # noqa: BLE001 - the survey records why a type does not build
        return Entry(model_type, False, False, time.perf_counter() - start, 0.0, f"build: {type(exc).__name__}: {exc}"), None
    built = time.perf_counter() - start
    start = time.perf_counter()
    try:
        with torch.no_grad():
            logits = model(inputs()).logits
        if not torch.isfinite(logits).all():
            raise ValueError("non-finite logits")
    except Exception as exc:  # noqa: BLE001
        return Entry(model_type, True, False, built, time.perf_counter() - start, f"forward: {type(exc).__name__}: {exc}"), model
    return Entry(model_type, True, True, built, time.perf_counter() - start), model


@functools.lru_cache(maxsize=None)
def cached(model_type: str) -> tuple[Entry, torch.nn.Module | None]:
    return survey(model_type)


# ---------------------------------------------------------------------------------------------
# Cells: one check of one model type, each on a fresh model. A check raises on failure; a check
# the unpatched model fails too raises NotApplicable (it would say nothing about the patch).

SITES = ("input", "qk", "score", "none")
SITE_SCHEMES = {"input": ("learned", {"init": "normal"}), "score": ("alibi", {}), "none": ("nope", {})}
# Shifted positions round differently in fp32 (~1e-6 per angle); deep or recurrent stacks (HRM)
# amplify that to ~2e-4. A wrong position costs O(1) with these weights.
SHIFTED_ATOL = 1e-3


class NotApplicable(Exception):
    """The stock model fails the same check, so the check cannot judge the patch."""


def adapter_of(model: torch.nn.Module):
    from hf_posenc.catalog import adapter_for

    return adapter_for(model)


def site_scheme(adapter, site: str) -> tuple[str, dict[str, Any]]:
    """The scheme a site's cells use: for q/k, a YaRN scaling where the model rotates natively,
    else plain RoPE through the q/k taps."""
    if site == "qk":
        return ("yarn", {"factor": 2.0}) if adapter.rotation else ("rope", {"theta": 100.0})
    return SITE_SCHEMES[site]


def logits(model: torch.nn.Module, x: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    with torch.no_grad():
        return model(x, **kwargs).logits.float()


def patched(model_type: str, site: str | None) -> torch.nn.Module:
    """A fresh model with the site's scheme patched in (`site=None`: the stock model)."""
    import hf_posenc as hp

    model = build(model_type)
    if site is not None:
        name, options = site_scheme(adapter_of(model), site)
        hp.patch(model, name, **options)
    return model


def check_native(model_type: str) -> None:
    """patch(model, its own scheme) with default options leaves the logits as they were."""
    import hf_posenc as hp

    model, x = build(model_type), inputs()
    before = logits(model, x)
    adapter = adapter_of(model)
    hp.patch(model, adapter.native, **native_options(adapter.native, model.config))
    torch.testing.assert_close(logits(model, x), before, atol=1e-5, rtol=1e-4)


def check_scaling_matches_transformers(model_type: str) -> None:
    """`yarn` x2 through hf_posenc == a stock model built from the same rope_parameters."""
    model, x = build(model_type), inputs()
    stock = logits(model, x)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    model = patched(model_type, "qk")
    ours = logits(model, x)
    config = copy.deepcopy(model.config)
    del config.posenc
    reference = type(model)(config).eval()
    reference.load_state_dict(weights)
    params = compat.text_config(reference.config).rope_parameters
    rotation = adapter_of(model).rotation
    per_type = rotation.layer_types if rotation else ()  # Gemma 3: every rotating layer type takes the scaling
    assert {p["rope_type"] for p in (params.values() if per_type else [params]) if p} == {"yarn"}
    torch.testing.assert_close(ours, logits(reference, x), atol=1e-5, rtol=1e-4)
    assert not torch.allclose(ours, stock, atol=1e-3), "yarn x2 had no effect"


def check_patch_unpatch(model_type: str, site: str) -> None:
    """Patching changes the logits (and `alibi` differs from `nope`: its bias is really applied);
    unpatch restores them bit for bit."""
    import hf_posenc as hp

    model, x = build(model_type), inputs()
    before = logits(model, x)
    adapter = adapter_of(model)
    name, options = site_scheme(adapter, site)
    hp.patch(model, name, **options)
    changed = logits(model, x)
    if name != adapter.native:
        assert not torch.allclose(changed, before, atol=1e-3), f"{name} had no effect"
    if name == "alibi" and hp.supports(model, "nope"):
        hp.patch(model, "nope")
        assert not torch.allclose(logits(model, x), changed, atol=1e-3), "alibi == nope: the bias was not applied"
    hp.unpatch(model)
    assert torch.equal(logits(model, x), before)


def check_relative(model_type: str) -> None:
    """RoPE through the q/k taps is relative: shifting every position changes nothing."""
    model, x = patched(model_type, "qk"), inputs(batch=1)
    positions = torch.arange(x.shape[1])[None]
    torch.testing.assert_close(logits(model, x, position_ids=positions + 5), logits(model, x, position_ids=positions),
                               atol=SHIFTED_ATOL, rtol=SHIFTED_ATOL)


def _cached_and_full(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    from transformers import DynamicCache

    full = logits(model, x)
    cache = DynamicCache(config=model.config)
    steps = [logits(model, x[:, :6], past_key_values=cache, use_cache=True)]
    for t in range(6, 10):
        steps.append(logits(model, x[:, t : t + 1], past_key_values=cache, use_cache=True))
    return torch.cat(steps, dim=1), full


def check_cache(model_type: str, site: str | None) -> None:
    """Prefill then token-by-token decoding == one uncached forward. A float32 difference over the
    tolerance is settled in float64, where rounding cannot hide or fake a wrong position: deep
    looped stacks round apart in float32 (hrm_text on transformers 5.24: 2.9e-4 in float32, 0 in float64)."""
    model, x = patched(model_type, site), inputs(length=10)
    try:
        torch.testing.assert_close(*_cached_and_full(model, x), atol=1e-4, rtol=1e-4)
    except AssertionError:
        torch.testing.assert_close(*_cached_and_full(model.double(), x), atol=1e-9, rtol=1e-9)


def check_left_padding(model_type: str, site: str | None) -> None:
    """A left-padded row of a batch == the same prompt alone. A patched model counts positions over
    the mask itself; the stock model (`site=None`) gets them the way `generate` passes them, so that
    absolute-position models are not blamed for transformers' default of counting padding."""
    model, x, pad = patched(model_type, site), inputs(batch=1, length=9), 3
    batch = torch.cat((torch.cat((torch.zeros(1, pad, dtype=torch.long), x), dim=1), inputs(batch=1, length=12, seed=5)))
    mask = torch.ones_like(batch)
    mask[0, :pad] = 0
    positions: dict[str, dict[str, torch.Tensor]] = {"alone": {}, "batch": {}}
    if site is None:
        offset = adapter_of(model).ids_offset(model.config)
        positions = {"alone": {"position_ids": torch.arange(x.shape[1])[None] + offset},
                     "batch": {"position_ids": (mask.cumsum(-1) - 1).clamp(min=0) + offset}}
    alone = logits(model, x, attention_mask=torch.ones_like(x), **positions["alone"])
    torch.testing.assert_close(logits(model, batch, attention_mask=mask, **positions["batch"])[0, pad:], alone[0],
                               atol=SHIFTED_ATOL, rtol=SHIFTED_ATOL)


def against_stock(check: Callable[[str, str | None], None], model_type: str, site: str) -> None:
    """Run `check` on the patched model, after making sure the stock model passes it."""
    try:
        check(model_type, None)
    except Exception as exc:  # noqa: BLE001 - whatever the stock model does wrong
        raise NotApplicable(f"the unpatched model fails it too ({type(exc).__name__}: "
                            f"{str(exc).splitlines()[0] if str(exc) else ''})") from exc
    check(model_type, site)


def cells(model: torch.nn.Module, baseline: bool = True) -> dict[str, Callable[[str], None]]:
    """name -> check(model_type), for the cells the adapter of `model` claims to support. With
    `baseline`, cache and padding cells first run on the stock model (NotApplicable if it fails)."""
    from hf_posenc.catalog import get_scheme

    adapter = adapter_of(model)
    supported = {s: sites.site_refusal(adapter, get_scheme(site_scheme(adapter, s)[0])) is None for s in SITES}
    out: dict[str, Callable[[str], None]] = {}
    slot = model.base_model.get_submodule(adapter.slot.path) if adapter.slot else None
    table_less = adapter.native == "learned" and not isinstance(getattr(slot, "weight", None), torch.Tensor)
    if sites.site_refusal(adapter, get_scheme(adapter.native)) is None and not table_less:
        out["native"] = check_native
    if supported["qk"]:
        out["yarn_vs_transformers" if adapter.rotation else "rope_relative"] = (
            check_scaling_matches_transformers if adapter.rotation else check_relative)
    def compared(check: Callable[[str, str | None], None], site: str) -> Callable[[str], None]:
        return functools.partial(against_stock, check, site=site) if baseline else functools.partial(check, site=site)

    for site in (s for s in SITES if supported[s]):
        out[f"patch_unpatch-{site}"] = functools.partial(check_patch_unpatch, site=site)
        if adapter.causal:
            out[f"cache-{site}"] = compared(check_cache, site)
        out[f"left_padding-{site}"] = compared(check_left_padding, site)
    return out


def run(check: Callable[[str], None], model_type: str) -> str:
    """'pass', 'n/a: reason' or 'fail: error' (the catalog's record of one cell)."""
    try:
        check(model_type)
    except NotApplicable as exc:
        return f"n/a: {exc}"[:300]
    except Exception as exc:  # noqa: BLE001 - the catalog records every failure with its message
        return f"fail: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
    return "pass"


def verdict(model: torch.nn.Module) -> dict[str, Any]:
    """The adapter's answer for this model: which schemes it takes and why not the others."""
    from hf_posenc.errors import PosEncError
    from hf_posenc.catalog import get_scheme, list_schemes

    try:
        adapter = adapter_of(model)
    except PosEncError as exc:
        return {"refused": str(exc)}
    why = {name: sites.site_refusal(adapter, get_scheme(name)) for name in list_schemes()}
    return {"adapter": adapter.name, "native": adapter.native,
            "sites": {site: why[site_scheme(adapter, site)[0]] is None for site in SITES},
            "supported": sorted(n for n, w in why.items() if w is None),
            "unsupported": {n: w for n, w in why.items() if w}, "gaps": dict(adapter.gaps)}


def status(row: dict[str, Any]) -> str:
    """full: every site supported and every cell passes; partial: some sites, all their cells pass."""
    if not row.get("builds"):
        return "no-build"
    if not row.get("forward"):
        return "no-forward"
    if "refused" in row:
        return "refused"
    if any(c["outcome"].startswith("fail") for c in row.get("cells", {}).values()):
        return "fails"
    sites = row.get("sites", {})
    return "full" if all(sites.values()) else "partial" if any(sites.values()) else "none"


def summary(catalog: dict[str, dict[str, Any]]) -> dict[str, Any]:
    by_status: dict[str, list[str]] = {}
    for model_type, row in catalog.items():
        by_status.setdefault(status(row), []).append(model_type)
    return {"counts": {k: len(v) for k, v in sorted(by_status.items())}, "types": by_status}


def reason(row: dict[str, Any]) -> str:
    """Why a type is not fully supported: the build error, the refusal, or the first reason per site."""
    if not row["forward"]:
        return row["error"].splitlines()[0]
    if "refused" in row:
        return row["refused"]
    failed = [f"{c}: {r['outcome']}" for c, r in row.get("cells", {}).items() if r["outcome"].startswith("fail")]
    sites = row["sites"]
    why = {}
    for site, ok in sites.items():
        if not ok:
            scheme = SITE_SCHEMES[site][0] if site != "qk" else "yarn" if row["structure"]["rotation"] else "rope"
            why.setdefault(row["unsupported"][scheme], []).append(site)
    return "; ".join([*failed, *(f"{'/'.join(s)}: {w}" for w, s in why.items())])


def table(catalog: dict[str, dict[str, Any]]) -> str:
    """Markdown: model type x site, yes/no, and the reason for every no."""
    lines = ["| model type | status | native | input | q/k | score | none | why not |", "|---|---|---|---|---|---|---|---|"]
    for model_type, row in catalog.items():
        sites = row.get("sites", {})
        marks = [("yes" if sites.get(s) else "no") for s in ("input", "qk", "score", "none")]
        why = reason(row) if status(row) != "full" else ""
        lines.append(f"| {model_type} | {status(row)} | {row.get('native', '')} | {' | '.join(marks)} | "
                     f"{why.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def shipped(catalog: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """hf_posenc/model_types.json: status, native scheme, sites and the reason per model type, for `list`."""
    return {"transformers": transformers.__version__,
            "types": {t: {"status": status(row), "native": row.get("native", ""),
                          "sites": {s: bool(row.get("sites", {}).get(s)) for s in SITES},
                          "why": reason(row).replace("|", "/") if status(row) != "full" else ""}
                      for t, row in catalog.items()}}


# The model types issue 11 names; docs/support.md says where each stands.
NAMED = ("gemma", "gemma2", "gemma3_text", "phi", "phi3", "gpt_neox", "opt", "bloom", "falcon", "mixtral", "qwen2_moe",
         "qwen3_moe", "olmo2", "granite", "stablelm", "starcoder2", "cohere")


def readme_block(catalog: dict[str, dict[str, Any]]) -> str:
    """The support page's summary of the catalog (tests/test_zoo.py checks docs/support.md holds it)."""
    counts = summary(catalog)["counts"]
    named = ", ".join(f"{t} {status(catalog[t])}" for t in NAMED if t in catalog)
    return (f"Of the {len(catalog)} causal-LM model types of transformers {transformers.__version__}, the zoo sweep "
            f"finds: {', '.join(f'{n} {s}' for s, n in counts.items())} (*full*: every site, each cell passing; "
            f"*partial*: the sites marked yes). Named in issue 11: {named}.\n")
