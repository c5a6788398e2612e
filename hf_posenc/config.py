"""PosEncConfig: the only state a patch saves (as `config.posenc` in config.json)."""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import operator
import types
import typing
from typing import Any, Union

from .domains import Domain, Relation, domain_of, expected, matches, relations_of, validate
from .domains import option as option  # re-exported: schemes declare options with it
from .errors import PosEncError, did_you_mean
from .paths import SNAPSHOT

FORMAT = 2  # 2: per-layer patches (`layers`, maps); a patch without them is still written as format 1
# a config-only patch's config.json holds the patched fields (what plain transformers loads); this key of config.posenc
# holds what they were, so hf-posenc rebuilds the model as it was before the patch (readers ignore unknown keys)
BEFORE = "config_before"


class PosEncConfig:
    """Which positional scheme a model uses, with validated options.

    Args:
        scheme: a name from `hf_posenc.list_schemes()`.
        stacks: encoder-decoder models only: which attention stacks take the scheme, a subset of
            `STACKS` (default: every text stack of the model). Not a scheme option: it says where, not what.
        layers: the indices of the attention layers that take the scheme (of each patched stack); the others
            keep the model's own positions. None: every layer. Also where, not what.
        **options: the scheme's options (e.g. `theta=1e4`, `factor=4.0`); unknown names are an error.
    """

    def __init__(self, scheme: str, stacks: Any = None, layers: Any = None, **options: Any) -> None:
        self.scheme = scheme_name(scheme)
        self.stacks = _check_stacks(stacks)
        self.layers = check_layers(layers)
        self.options = validate(self.scheme, options_class(self.scheme), options)

    @property
    def entries(self) -> tuple["PosEncConfig", ...]:
        """The entries of the patch, as a `LayerMap` has them: one scheme is its own one entry."""
        return (self,)

    def to_dict(self, original: str | None = None) -> dict[str, Any]:
        out = {"format": 1 if self.layers is None else FORMAT, "scheme": self.scheme,
               "options": dict(self.options), "from": original}
        out.update({k: list(v) for k, v in (("stacks", self.stacks), ("layers", self.layers)) if v is not None})
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "config.posenc") -> "PosEncConfig | LayerMap":
        """Read `config.posenc` (a `LayerMap` when it holds one); `where` names it in errors (a folder's
        config.json, a recipe)."""
        if not isinstance(data, dict) or ("scheme" not in data and "map" not in data):
            raise PosEncError(f"{where} is not a hf-posenc config: {data!r}; expected a dict with 'format', "
                              "'scheme', 'options' (or 'map')")
        version = data.get("format", FORMAT)
        if isinstance(version, bool) or not isinstance(version, int) or version > FORMAT:
            raise PosEncError(
                f"{where} has format {version!r}, written by a newer hf-posenc; this version reads "
                f"format <= {FORMAT}. Upgrade with `pip install -U hf-posenc`."
            )
        if "map" in data:
            return LayerMap.from_dict(data["map"], where)
        options = data.get("options", {})
        if not isinstance(options, dict):
            raise PosEncError(f"{where}.options must be a dict of option names to values, got {options!r}")
        try:
            return cls(data["scheme"], stacks=data.get("stacks"), layers=data.get("layers"), **options)
        except PosEncError as err:
            raise PosEncError(f"{where}: {err}") from err

    def resolved(self, options: dict[str, Any], facts: dict[str, Any]) -> "PosEncConfig":
        """This config with `options`, its scheme's resolved against a model whose domain-named `facts` are given:
        what the resolution changed is checked against the domains, and every option against the facts (what it
        kept was checked when this config was made)."""
        out = copy.copy(self)
        out.options = validate(self.scheme, options_class(self.scheme), options, self.options, facts)
        return out

    def replace(self, **options: Any) -> "PosEncConfig":
        """This config with other options, stacks or layers (only what changed is checked)."""
        stacks, layers = options.pop("stacks", self.stacks), options.pop("layers", self.layers)
        if options:
            return PosEncConfig(self.scheme, stacks=stacks, layers=layers, **{**self.options, **options})
        out = copy.copy(self)
        out.stacks, out.layers, out.options = _check_stacks(stacks), check_layers(layers), dict(self.options)
        return out

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PosEncConfig) and (self.scheme, self.stacks, self.layers, self.options) == \
            (other.scheme, other.stacks, other.layers, other.options)

    def __repr__(self) -> str:
        where = [f"{k}={v!r}" for k, v in (("stacks", self.stacks), ("layers", self.layers)) if v is not None]
        opts = [f"{k}={v!r}" for k, v in self.options.items()]
        return f"PosEncConfig({', '.join([f'scheme={self.scheme!r}', *where, *opts])})"


class LayerMap:
    """Several schemes at once, each in its own layers (as Gemma 3's two thetas, or SmolLM3's NoPE every
    fourth layer with RoPE elsewhere); layers no entry names keep the model's own positions.

    Args:
        entries: `PosEncConfig`s that each name their `layers` (no layer in two of them), or a dict
            `{scheme: layers}` for entries without options.
    """

    def __init__(self, entries: Any) -> None:
        if isinstance(entries, dict):
            entries = [PosEncConfig(scheme, layers=layers) for scheme, layers in entries.items()]
        if not isinstance(entries, (list, tuple)) or not entries or \
                not all(isinstance(e, PosEncConfig) for e in entries):
            raise PosEncError(f"a layer map is a non-empty list of PosEncConfig (or a dict scheme -> layers), "
                              f"got {entries!r}")
        owners: dict[int, str] = {}
        for entry in entries:
            if entry.layers is None:
                raise PosEncError(f"every entry of a layer map names its layers; {entry!r} names none")
            for layer in entry.layers:
                if layer in owners:
                    raise PosEncError(f"layer {layer} is in two entries of the map ({owners[layer]!r} and "
                                      f"{entry.scheme!r}); each layer takes one scheme")
                owners[layer] = entry.scheme
        if len({entry.stacks for entry in entries}) > 1:
            raise PosEncError(f"the entries of a layer map name different stacks: {[e.stacks for e in entries]}")
        self.entries: tuple[PosEncConfig, ...] = tuple(entries)

    @property
    def scheme(self) -> str:
        """The entries' schemes, for labels: 'nope+rope'."""
        return "+".join(dict.fromkeys(entry.scheme for entry in self.entries))

    @property
    def options(self) -> dict[str, Any]:
        """The entries' layers and options, for labels and reports."""
        return {f"{e.scheme}@{','.join(map(str, e.layers))}": dict(e.options) for e in self.entries}

    @property
    def stacks(self) -> tuple[str, ...] | None:
        return self.entries[0].stacks

    @property
    def layers(self) -> tuple[int, ...]:
        return tuple(sorted(layer for entry in self.entries for layer in entry.layers))

    def replace(self, **where: Any) -> "LayerMap":
        """The map with `stacks` (the one field entries share) replaced in every entry."""
        return LayerMap([entry.replace(**where) for entry in self.entries])

    def to_dict(self, original: str | None = None) -> dict[str, Any]:
        entries = [{k: v for k, v in e.to_dict().items() if k not in ("format", "from")} for e in self.entries]
        return {"format": FORMAT, "map": entries, "from": original}

    @classmethod
    def from_dict(cls, entries: Any, where: str = "config.posenc") -> "PosEncConfig | LayerMap":
        if not isinstance(entries, list):
            raise PosEncError(f"{where}.map must be a list of entries, got {entries!r}")
        return layer_patch([PosEncConfig.from_dict({**e, "format": FORMAT}, f"{where}.map[{i}]")
                            if isinstance(e, dict) else e for i, e in enumerate(entries)])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LayerMap) and self.entries == other.entries

    def __repr__(self) -> str:
        return f"LayerMap([{', '.join(map(repr, self.entries))}])"


def layer_patch(entries: Any) -> "PosEncConfig | LayerMap":
    """A map of one entry is that entry (so `describe` says `PosEncConfig(..., layers=...)`), else a LayerMap."""
    patch = LayerMap(entries)
    return patch.entries[0] if len(patch.entries) == 1 else patch


def as_patch(scheme: Any, options: dict[str, Any]) -> PosEncConfig | LayerMap:
    """What `patch` and `validate` are handed, as a config: a scheme name with its options, a `PosEncConfig` (with
    options to replace), or a per-layer map (a `LayerMap`, a dict {scheme: layers} or a list of entries)."""
    if isinstance(scheme, PosEncConfig):
        return scheme.replace(**options) if options else scheme
    if isinstance(scheme, str):
        return PosEncConfig(scheme, **options)
    if isinstance(scheme, (LayerMap, dict, list)):
        if options:
            raise PosEncError(f"a layer map takes its options in its entries; got {sorted(options)} beside it")
        return layer_patch(scheme.entries if isinstance(scheme, LayerMap) else scheme)
    raise PosEncError(f"scheme must be a name, a PosEncConfig or a layer map, got {type(scheme).__name__}")


def check_layers(layers: Any) -> tuple[int, ...] | None:
    """None, or distinct non-negative layer indices, sorted (from a list, a tuple or one index)."""
    if layers is None:
        return None
    indices = [layers] if isinstance(layers, int) and not isinstance(layers, bool) else layers
    if not isinstance(indices, (list, tuple)) or not indices or \
            any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in indices):
        raise PosEncError(f"layers must be a non-empty list of layer indices (integers >= 0), got {layers!r}")
    if len(set(indices)) < len(indices):
        twice = sorted({i for i in indices if indices.count(i) > 1})
        raise PosEncError(f"layers names layer {', '.join(map(str, twice))} more than once: {list(indices)}")
    return tuple(sorted(indices))


STACKS = ("encoder", "decoder")  # the attention stacks of an encoder-decoder model, in the order they run


def _check_stacks(stacks: Any) -> tuple[str, ...] | None:
    """None, or a non-empty subset of STACKS in their order (from a tuple, a list or one name)."""
    if stacks is None:
        return None
    names = [stacks] if isinstance(stacks, str) else stacks
    if not isinstance(names, (list, tuple)) or not names or any(n not in STACKS for n in names):
        raise PosEncError(f"stacks must be a non-empty list of {', '.join(map(repr, STACKS))}, got {stacks!r}")
    return tuple(n for n in STACKS if n in names)


# The options class of every registered scheme, by name: `schemes.base.register_scheme` fills it, so that what a
# config checks needs no torch (the schemes import it) and the config never looks up at the schemes.
OPTIONS: dict[str, type] = {}


def scheme_name(scheme: Any) -> str:
    """`scheme` if it names a built-in or registered scheme (decided without importing torch), else PosEncError."""
    known = {*builtin_options(), *OPTIONS}
    if not isinstance(scheme, str):
        raise PosEncError(f"scheme must be a scheme name (a string), got {type(scheme).__name__} {scheme!r}; "
                          f"available schemes: {', '.join(sorted(known))}")
    if scheme not in known:
        raise PosEncError(f"unknown scheme {scheme!r}{did_you_mean(scheme, known)}; available schemes: "
                          f"{', '.join(sorted(known))}")
    return scheme


def options_class(scheme: str) -> type:
    """The options dataclass of a scheme: the registered scheme's own once the schemes are imported (they import
    torch), else a built-in's rebuilt from the snapshot of its declaration (`options_snapshot`)."""
    return OPTIONS[scheme] if scheme in OPTIONS else snapshot_options(scheme)


# The built-in schemes' options as data, so that a user's options are checked before torch is imported: written
# with the rest of the registry's snapshot (`catalog.write_snapshot`, support.json; a test keeps it current), read
# back into a dataclass with the same fields, domains and relations. Types are those option annotations use.
TYPES: dict[str, Any] = {"int": int, "float": float, "str": str, "bool": bool, "None": type(None),
                         "list[float]": list[float], "list[int]": list[int], "list[str]": list[str]}
KINDS = {kind.__name__: kind for kind in (int, float, str, list)}  # a Domain's kind


def options_snapshot(options_cls: type) -> dict[str, Any]:
    """An options dataclass as JSON data: each field's type, default, help and domain, and its relations."""
    hints = typing.get_type_hints(options_cls)
    fields = []
    for field in dataclasses.fields(options_cls):
        domain = domain_of(field)
        fields.append({"name": field.name, "type": _type_name(hints[field.name]), "default": field.default,
                       "help": field.metadata.get("help", ""), "domain": None if domain is None else
                       {**dataclasses.asdict(domain), "kind": domain.kind.__name__}})
    return {"class": options_cls.__name__, "fields": fields,
            "relations": [dataclasses.asdict(relation) for relation in relations_of(options_cls)]}


@functools.cache
def builtin_options() -> dict[str, dict[str, Any]]:
    """{scheme: `options_snapshot` of its options} for every built-in scheme, read from the registry's snapshot."""
    return json.loads(SNAPSHOT.read_text(encoding="utf-8"))["options"]


@functools.cache
def snapshot_options(scheme: str) -> type:
    """A built-in scheme's options dataclass, rebuilt from its snapshot (no torch: its module is not imported)."""
    data = builtin_options()[scheme]
    fields = [(f["name"], _type_of(f["type"]),
               option(f["default"], f["help"], None if f["domain"] is None else _domain(f["domain"])))
              for f in data["fields"]]
    relations = tuple(Relation(**{**r, "when": tuple(r["when"]) if r["when"] is not None else None})
                      for r in data["relations"])
    return dataclasses.make_dataclass(data["class"], fields, frozen=True, namespace={"relations": relations})


def _type_name(hint: Any) -> str:
    """An option's annotation as the snapshot writes it: 'float | None', 'list[float]'."""
    if typing.get_origin(hint) in (Union, types.UnionType):
        return " | ".join(_type_name(arg) for arg in typing.get_args(hint))
    name = "None" if hint is type(None) else str(hint) if typing.get_origin(hint) else hint.__name__
    if name not in TYPES:
        raise TypeError(f"an option of type {name} cannot go in the options snapshot: use one of {list(TYPES)}")
    return name


def _type_of(name: str) -> Any:
    return functools.reduce(operator.or_, (TYPES[part] for part in name.split(" | ")))


def _domain(data: dict[str, Any]) -> Domain:
    return Domain(**{**data, "kind": KINDS[data["kind"]], "choices": tuple(data["choices"])})


def option_table(scheme: str) -> list[dict[str, Any]]:
    """Each option of `scheme`: name, type, default, domain, help (what `hf-posenc list --scheme` prints)."""
    options_cls = options_class(scheme_name(scheme))
    hints = typing.get_type_hints(options_cls)
    rows = []
    for field in dataclasses.fields(options_cls):
        domain = domain_of(field)
        rows.append({"option": field.name, "type": expected(hints[field.name]),
                     "default": None if field.default is dataclasses.MISSING else field.default,
                     "domain": domain.text() if domain else "any " + expected(hints[field.name]),
                     "source": domain.source if domain else "", "help": field.metadata.get("help", "")})
    return rows


def required_options(scheme: str) -> set[str]:
    """The options of `scheme` that have no default (a scaling's `factor`)."""
    options_cls = options_class(scheme_name(scheme))
    hints = typing.get_type_hints(options_cls)
    return {f.name for f in dataclasses.fields(options_cls)
            if f.default is dataclasses.MISSING or (f.default is None and not matches(None, hints[f.name]))}
