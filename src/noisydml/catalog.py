"""Catalogs of plug-ins discovered by file name (methods, studies): listed without importing them, and one
imported by name, so a stage imports (and DVC tracks) only the plug-in it uses."""

from __future__ import annotations

import importlib
from pathlib import Path

from noisydml.schema import ParamsError


def names_in(folder: Path, not_members: set[str]) -> list[str]:
    """The members of a catalog: the ``*.py`` files of ``folder`` but ``not_members``, sorted."""
    return sorted(p.stem for p in Path(folder).glob("*.py") if p.stem not in not_members)


def load_member(package: str, name: str, names: list[str], attribute: str, what: str):
    """``<package>.<name>.<attribute>`` (imports that module only), refusing a name the catalog does not list."""
    if name not in names:
        raise ParamsError(f"unknown {what} {name!r}; allowed: {', '.join(names)}")
    member = getattr(importlib.import_module(f"{package}.{name}"), attribute, None)
    if member is None:
        raise ParamsError(f"{package.replace('.', '/')}/{name}.py defines no {attribute}")
    return member
