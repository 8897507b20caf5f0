"""The schema vocabulary every params section is declared in: :class:`Field`, :func:`check_section`.

A leaf module (no noisydml imports): registries (dataset kinds, noise kinds,
methods, backbones) and :mod:`noisydml.config` all declare their sections with
it, so none of them needs to import another to be validated.

The validation itself is pydantic v2's (strict mode: a YAML string is never a number, ``true`` never an
int; no NaN or infinity): each declared section becomes a pydantic model (:func:`section_model`), which also
gives the JSON Schema of params.yaml (:mod:`noisydml.tools.params_schema`). Pydantic's errors are re-worded here so
every message names the key, the value and what is allowed.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import importlib
import io
import re
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Literal, Mapping, Sequence, Union

import annotated_types
import pydantic
from pydantic import ConfigDict, ValidationError

_REQUIRED = object()
#: Names used in DVC stage names: no separators DVC or paths would split on.
_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


class ParamsError(ValueError):
    """A problem in params.yaml; the message names the key and the value."""


#: At most this many problems are listed at once (the rest counted).
MAX_ERRORS = 25


class ParamsErrors(ParamsError):
    """Several problems in params.yaml, each a :class:`ParamsError`'s message, found in one pass."""

    def __init__(self, messages: Sequence[str], prefix: str = ""):
        self.messages = list(dict.fromkeys(messages))  # in order, once each
        self.prefix = prefix  # the file, named once
        super().__init__(self.text(prefix))

    def text(self, prefix: str = "") -> str:
        if len(self.messages) == 1:
            return prefix + self.messages[0]
        shown = self.messages[:MAX_ERRORS]
        more = len(self.messages) - len(shown)
        return (f"{prefix}{len(self.messages)} problems:\n" + "\n".join(f"  - {m}" for m in shown)
                + (f"\n  ... and {more} more" if more else ""))


def messages_of(error: ParamsError) -> list[str]:
    return list(error.messages) if isinstance(error, ParamsErrors) else [str(error)]


class ErrorCollector:
    """Runs checks one after another and keeps every :class:`ParamsError` they raise (``with errors.check():``),
    so that one pass reports every problem; ``raise_if_any()`` raises them together."""

    def __init__(self):
        self.messages: list[str] = []

    @contextlib.contextmanager
    def check(self):
        try:
            yield
        except ParamsError as e:
            self.messages.extend(messages_of(e))

    def raise_if_any(self) -> None:
        if self.messages:
            raise ParamsErrors(self.messages)


def flow(value: Any) -> str:
    """``value`` as one line of flow-style YAML (``3``, ``[a, b]``, ``{k: v}``, quoted where YAML needs it)."""
    from ruamel.yaml import YAML

    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = True
    yaml.width = 1 << 30
    out = io.StringIO()
    yaml.dump(value, out)
    text = out.getvalue().rstrip("\n")
    if text.endswith("\n..."):  # a scalar document's end marker
        text = text[: -len("\n...")]
    return text.strip()


def did_you_mean(value: Any, allowed: Sequence[Any]) -> str:
    """``"; did you mean 'x'?"`` for a near miss among ``allowed`` (difflib), else ``""``."""
    close = difflib.get_close_matches(str(value), [str(a) for a in allowed], n=1, cutoff=0.75)
    return f"; did you mean {close[0]!r}?" if close else ""


@dataclass(frozen=True)
class Field:
    """One key of a params section: its type, default and allowed range."""

    type: type | tuple[type, ...]
    default: Any = _REQUIRED
    min: float | None = None
    max: float | None = None
    #: An exclusive minimum (a learning rate: above 0).
    above: float | None = None
    choices: Sequence[Any] | None = None
    #: For list fields: the type of every element.
    item_type: type | tuple[type, ...] | None = None
    help: str = ""

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED


def _type_name(t: type | tuple[type, ...]) -> str:
    if isinstance(t, tuple):
        return " or ".join(x.__name__ for x in t)
    return t.__name__


def _annotation(field: Field) -> Any:
    """The pydantic annotation of a declared field: its type(s), choices, bounds (of the value, or of every item
    of a list)."""
    bounds = [c for c in (None if field.min is None else annotated_types.Ge(field.min),
                          None if field.max is None else annotated_types.Le(field.max),
                          None if field.above is None else annotated_types.Gt(field.above)) if c is not None]
    if field.choices is not None:
        return Literal[tuple(field.choices)]
    if field.item_type is not None:
        item = field.item_type if not isinstance(field.item_type, tuple) else Union[field.item_type]
        return list[Annotated[item, *bounds]] if bounds else list[item]
    kind = field.type if not isinstance(field.type, tuple) else Union[field.type]
    return Annotated[kind, *bounds] if bounds else kind


def _model_key(schema: Mapping[str, Field]) -> tuple:
    return tuple((key, repr(field)) for key, field in schema.items())


_MODELS: dict[tuple, type[pydantic.BaseModel]] = {}


def section_model(schema: Mapping[str, Field], allow_extra: bool = False,
                  title: str = "section") -> type[pydantic.BaseModel]:
    """The pydantic model of a declared section (cached per declaration). Keys are aliases of positional field
    names, so no params key can clash with pydantic's own attributes; ``help`` becomes each key's description."""
    key = (_model_key(schema), allow_extra, title)
    if key not in _MODELS:
        fields = {}
        for number, (name, field) in enumerate(schema.items()):
            default = ... if field.required else field.default
            fields[f"f{number}"] = (_annotation(field), pydantic.Field(
                default, alias=name, description=field.help or None, validate_default=False))
        config = ConfigDict(strict=True, allow_inf_nan=False, extra="allow" if allow_extra else "forbid",
                            title=title, populate_by_name=False)
        _MODELS[key] = pydantic.create_model(f"Section{len(_MODELS)}", __config__=config, **fields)
    return _MODELS[key]


def _path(where: str, loc: tuple) -> str:
    return where + "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc if part != "")


def _message(error: Mapping[str, Any], schema: Mapping[str, Field], where: str) -> str:
    """One pydantic error as our message: ``<key path>: <value> ...; allowed ...``."""
    loc, value, kind, ctx = error["loc"], error.get("input"), error["type"], error.get("ctx", {})
    field, path = (schema.get(loc[0]) if loc else None), _path(where, loc)
    if kind == "missing":
        return f"{where}: missing required key {loc[0]!r}" + (f" ({field.help})" if field and field.help else "")
    if kind == "extra_forbidden":
        return (f"{where}: unknown key {loc[0]!r}{did_you_mean(loc[0], list(schema))}; allowed keys: "
                f"{', '.join(sorted(schema)) or '(none)'}")
    if kind == "greater_than_equal":  # the bound as declared (pydantic's ctx has it converted)
        low = field.min if field else ctx["ge"]
        high = f" to {field.max}" if field is not None and field.max is not None else " or more"
        return f"{path}: {value!r} is below the minimum {low}; allowed: {low}{high}"
    if kind == "greater_than":
        return f"{path}: {value!r} is not allowed; allowed: above {field.above if field else ctx['gt']}"
    if kind == "less_than_equal":
        high = field.max if field else ctx["le"]
        low = (f"{field.min} to " if field is not None and field.min is not None else
               f"above {field.above} to " if field is not None and field.above is not None else "at most ")
        return (f"{path}: {value!r} is above the maximum {high}; allowed: {low}{high}"
                + (_RATE_HINT if _is_rate(loc) and field and field.max is not None and field.max <= 1
                   and isinstance(value, (int, float)) and value > 1 else ""))
    if kind == "literal_error" and field is not None:
        return (f"{path}: {value!r} is not allowed{did_you_mean(value, list(field.choices))}; allowed values: "
                f"{', '.join(map(str, field.choices))}")
    if kind == "finite_number":
        return f"{path}: must be a finite number, got {value!r}"
    if field is None:
        return f"{path}: {error['msg']}, got {value!r}"
    expected = field.item_type if field.item_type is not None and len(loc) > 1 else field.type
    # bool is an int subclass: say plainly that a YAML true is not a number
    suffix = "" if isinstance(value, bool) else f" ({type(value).__name__})"
    hint = _RATE_HINT if _is_rate(loc) and isinstance(value, str) and value.strip().endswith("%") else ""
    return f"{path}: expected {_type_name(expected)}, got {value!r}{suffix}{hint}"


#: Said where a rate (a fraction) was written as a percentage (50, or "50%").
_RATE_HINT = "; rates are fractions: write 0.5 for 50%"


def _is_rate(loc: tuple) -> bool:
    return bool(loc) and isinstance(loc[0], str) and (loc[0] == "rate" or loc[0].endswith("_rate"))


def _located(error: Mapping[str, Any]) -> dict[str, Any]:
    """The error with its location in params terms: the key (pydantic reports the alias, i.e. the params key) and
    list indices; pydantic's own location parts (union / literal / constraint branches) dropped."""
    loc = tuple(part for number, part in enumerate(error["loc"]) if number == 0 or isinstance(part, int))
    return {**error, "loc": loc}


def _in_order(errors: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The errors in the order a reader fixes them: unknown keys (by name: a typo is the likeliest cause of the
    rest), then the others in declared order; one per key."""
    unknown = sorted((e for e in errors if e["type"] == "extra_forbidden"), key=lambda e: str(e["loc"][0]))
    seen, out = set(), []
    for error in [*unknown, *(e for e in errors if e["type"] != "extra_forbidden")]:
        if error["loc"] not in seen:
            seen.add(error["loc"])
            out.append(error)
    return out


@functools.lru_cache(maxsize=None)
def _adapter(field_repr: str, annotation: Any) -> pydantic.TypeAdapter:
    return pydantic.TypeAdapter(annotation, config=ConfigDict(strict=True, allow_inf_nan=False))


def _check_value(value: Any, field: Field, where: str) -> Any:
    """One value against one declared field (``where`` names it)."""
    try:
        return _adapter(repr(field), _annotation(field)).validate_python(value)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        raise ParamsError(_message(_located({**error, "loc": ("", *error["loc"])}), {"": field},
                                   where)) from None


def check_section(
    section: Any, schema: Mapping[str, Field], where: str, *, allow_extra: bool = False
) -> dict[str, Any]:
    """Validate ``section`` against ``schema`` (pydantic, strict) and return it with defaults filled in, keys in
    declared order (then the extra keys, where allowed)."""
    if section is None:
        section = {}
    if not isinstance(section, Mapping):
        raise ParamsError(f"{where}: expected a mapping, got {section!r}")
    try:
        validated = section_model(schema, allow_extra).model_validate(dict(section))
    except ValidationError as exc:
        errors = [_located(e) for e in exc.errors(include_url=False)]
        raise ParamsErrors([_message(e, schema, where) for e in _in_order(errors)]) from None
    out = validated.model_dump(by_alias=True)
    if allow_extra:
        out.update({k: v for k, v in section.items() if k not in schema})
    return out


#: ``methods.<name>.per_noise``: noise setting -> overrides of the method's hyper-parameters for runs on that noise
#: (e.g. Co-teaching's forget rate set to each column's noise rate, as its papers do); validated by
#: :func:`noisydml.methods.check_method`, applied by :meth:`noisydml.runs.Run.params` before a run's own overrides.
PER_NOISE = "per_noise"


def merged(section: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``section`` with ``overrides`` set on top; a nested mapping is merged key by key (one level), as DVC's
    ``-S`` merges mappings."""
    out = dict(section)
    for key, value in overrides.items():
        nested = isinstance(value, Mapping) and isinstance(out.get(key), Mapping)
        out[key] = {**out[key], **value} if nested else value
    return out


def check_name(name: Any, where: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ParamsError(
            f"{where}: {name!r} is not a valid name (letters, digits and '_', starting with a letter); "
            "names become parts of DVC stage names and paths"
        )
    return name


def check_choice(value: Any, allowed: Sequence[str], where: str, what: str, note: str = "") -> str:
    """``value`` if it is one of ``allowed``; else a refusal naming ``where``, the value, a near miss and what is
    allowed (``note``: said after it, e.g. where the allowed names come from)."""
    if value not in allowed:
        raise ParamsError(
            f"{where}: unknown {what} {value!r}{did_you_mean(value, allowed)}; allowed: "
            f"{', '.join(sorted(allowed)) or '(none defined)'}{note}"
        )
    return value


def check_kinded(params: dict, section: str, name: str, kinds: Mapping[str, Any], what: str) -> dict:
    """Validate ``<section>.<name>`` (a mapping with a ``kind``) with that kind's ``check(body, where)``;
    store the result (defaults filled in) back into params and return it."""
    body = params[section][name]
    where = f"{section}.{name}"
    kind = check_choice(body["kind"], list(kinds), f"{where}.kind", f"{what} kind")
    params[section][name] = {"kind": kind, **kinds[kind].check({k: v for k, v in body.items() if k != "kind"}, where)}
    return params[section][name]


def check_sha256(value: Any, where: str, min_digits: int = 64) -> str:
    """``value`` as a lower-case hex sha256; with ``min_digits`` < 64, a prefix of at least that many digits is
    accepted too (publishers name weight files by one)."""
    sha = str(value).lower()
    if not (min_digits <= len(sha) <= 64 and all(c in "0123456789abcdef" for c in sha)):
        allowed = "64 hex digits" if min_digits >= 64 else f"{min_digits} to 64 hex digits"
        what = "a sha256" if min_digits >= 64 else "a sha256 or a prefix of one"
        raise ParamsError(f"{where}: {value!r} is not {what}; allowed: {allowed}")
    return sha


def check_unique(values: list, where: str) -> None:
    """Refuse a value listed twice in ``values`` (a list of params at ``where``)."""
    seen = set()
    for v in values:
        if v in seen:
            raise ParamsError(f"{where}: {v!r} is listed twice")
        seen.add(v)


def mapping_or_empty(section: Any, key: str, what: str) -> Mapping:
    """A section of keyed entries that may be empty (``{}`` or left blank)."""
    if section is None:
        return {}
    if not isinstance(section, Mapping):
        raise ParamsError(f"{key}: expected a mapping of {what}")
    return section


def check_named_sections(section: Any, key: str, what: str) -> dict[str, dict]:
    """``{name: {kind: ..., ...}}`` sections (datasets, noise settings): names and the ``kind`` key.

    The body of each entry is validated by its kind's registry when a stage uses it
    (:func:`noisydml.data.registry.check_dataset`, :func:`noisydml.noise.check_noise`), or all at once
    by :func:`noisydml.tools.check.check_all`.
    """
    if not isinstance(section, Mapping) or not section:
        raise ParamsError(f"{key}: expected a non-empty mapping of {what} name -> settings")
    out = {}
    for name, body in section.items():
        where = f"{key}.{check_name(name, key)}"
        if not isinstance(body, Mapping) or "kind" not in body:
            raise ParamsError(f"{where}: expected a mapping with a 'kind' key")
        out[name] = dict(body)
    return out


# --------------------------------------------------------------------------
# Which module validates each top-level section of params.yaml
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class SectionCheck:
    """How one top-level section of params.yaml is validated: ``check(section, validated, raw)`` returns the
    section with its defaults filled in (``validated``: the sections of ``needs``, already validated; ``raw``: the
    whole file as written, for the names another section defines)."""

    check: Callable[[Any, dict[str, Any], Mapping[str, Any]], Any]
    #: Sections validated first (their values are read by ``check``); a stage that loads this one loads them too.
    needs: tuple[str, ...] = ()
    #: Sections validated first and read when they validated: the rules that read one that failed are skipped,
    #: the section's own keys still checked (so a mistake in ``runtime`` hides none in ``train``).
    reads: tuple[str, ...] = ()
    #: A view of another section: the top-level key it reads and is stored under (e.g. ``tuned_runs``: the keys of
    #: ``tuning`` that name runs, without the search that validating all of ``tuning`` imports); None: its own.
    source: str | None = None


#: The top-level sections of params.yaml, in the file's order.
TOP_LEVEL = ("grid", "method_sets", "datasets", "noise", "noise_runs", "pretrain", "weights", "train", "runtime",
             "evaluate", "methods", "chains", "tuning", "tracking", "report", "timing", "figures")
#: The module whose ``SECTION_CHECKS[<section>]`` validates each top-level section, imported by name only when a
#: stage loads that section (:func:`noisydml.config.load_params`): a stage's code is what its own sections need.
#: Each section has a module of its own (``noisydml.sections.<name>``: its schema, its rules and the helpers that
#: read it), so a change to one section's schema re-runs the stages that load that section and no other; the config
#: core (loading, ordering, collecting problems) imports none of them.
SECTION_OWNERS: dict[str, str] = {
    **{name: f"noisydml.sections.{name}" for name in TOP_LEVEL},  # a module per section, its schema and rules
    "report": "noisydml.pipeline.report_params",  # the report stage's alone: a report key re-runs no training
    "evaluate": "noisydml.evaluation",
    "tuning": "noisydml.tuning",
    "tuned_runs": "noisydml.runs",  # a view of tuning: the keys that name the tuned runs
}


def section_check(name: str) -> SectionCheck:
    """The :class:`SectionCheck` of top-level section ``name`` (imports its owner module)."""
    if name not in SECTION_OWNERS:
        raise ParamsError(f"params: unknown section {name!r}; allowed: {', '.join(SECTION_OWNERS)}")
    return importlib.import_module(SECTION_OWNERS[name]).SECTION_CHECKS[name]
