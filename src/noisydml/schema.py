"""The schema vocabulary every params section is declared in: :class:`Field`, :func:`check_section`.

A leaf module (no noisydml imports): registries (dataset kinds, noise kinds,
methods, backbones) and :mod:`noisydml.config` all declare their sections with
it, so none of them needs to import another to be validated.
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

_REQUIRED = object()
#: Names used in DVC stage names: no separators DVC or paths would split on.
_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


class ParamsError(ValueError):
    """A problem in params.yaml; the message names the key and the value."""


@dataclass(frozen=True)
class Field:
    """One key of a params section: its type, default and allowed range."""

    type: type | tuple[type, ...]
    default: Any = _REQUIRED
    min: float | None = None
    max: float | None = None
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


def _check_value(value: Any, field: Field, where: str) -> Any:
    expected = field.type
    # YAML writes 1 for 1.0: accept ints where floats are expected.
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    # bool is an int subclass: a YAML true must not pass where a number is expected.
    if isinstance(value, bool) and bool not in (expected if isinstance(expected, tuple) else (expected,)):
        raise ParamsError(f"{where}: expected {_type_name(expected)}, got {value!r}")
    if not isinstance(value, expected):
        raise ParamsError(
            f"{where}: expected {_type_name(expected)}, got {value!r} ({type(value).__name__})"
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise ParamsError(f"{where}: must be a finite number, got {value!r}")
    if field.choices is not None and value not in field.choices:
        raise ParamsError(
            f"{where}: {value!r} is not allowed; allowed values: {', '.join(map(str, field.choices))}"
        )
    if field.item_type is not None:
        for i, item in enumerate(value):
            _check_value(item, Field(field.item_type, min=field.min, max=field.max), f"{where}[{i}]")
        return value
    if field.min is not None and value < field.min:
        raise ParamsError(f"{where}: {value!r} is below the minimum {field.min}")
    if field.max is not None and value > field.max:
        raise ParamsError(f"{where}: {value!r} is above the maximum {field.max}")
    return value


def check_section(
    section: Any, schema: Mapping[str, Field], where: str, *, allow_extra: bool = False
) -> dict[str, Any]:
    """Validate ``section`` against ``schema`` and return it with defaults filled in."""
    if section is None:
        section = {}
    if not isinstance(section, Mapping):
        raise ParamsError(f"{where}: expected a mapping, got {section!r}")
    unknown = sorted(set(section) - set(schema))
    if unknown and not allow_extra:
        raise ParamsError(
            f"{where}: unknown key {unknown[0]!r}; allowed keys: {', '.join(sorted(schema)) or '(none)'}"
        )
    out: dict[str, Any] = dict(section) if allow_extra else {}
    for key, field in schema.items():
        if key in section:
            out[key] = _check_value(section[key], field, f"{where}.{key}")
        elif field.required:
            raise ParamsError(f"{where}: missing required key {key!r}" + (f" ({field.help})" if field.help else ""))
        else:
            out[key] = copy.deepcopy(field.default)
    return out


def check_name(name: Any, where: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ParamsError(
            f"{where}: {name!r} is not a valid name (letters, digits and '_', starting with a letter); "
            "names become parts of DVC stage names and paths"
        )
    return name


def check_choice(value: Any, allowed: Sequence[str], where: str, what: str) -> str:
    if value not in allowed:
        raise ParamsError(
            f"{where}: unknown {what} {value!r}; allowed: {', '.join(sorted(allowed)) or '(none defined)'}"
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
