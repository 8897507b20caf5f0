"""params.yaml: loading and validation, one top-level section at a time.

params.yaml is the single source of truth of the pipeline. Every stage calls
:func:`load_params` first with the sections it reads (those dvc.yaml declares
for it, and the ones it only names things from), so a mistake in them (a rate
outside [0, 1], a batch with more classes than the dataset has, ...) stops the
stage before any work, with a message that names the key, the bad value and
what is allowed; a section the stage does not load is neither validated nor
readable there, and its code is not the stage's code.

Each section is validated by the module that owns it
(:data:`noisydml.schema.SECTION_OWNERS`: ``noisydml.sections.<name>``, or the
tuning, evaluation and report modules for theirs), imported by name only when a
stage loads that section: this module holds none of them, so a change to one
section's schema reaches the stages that load it and no other. Each registry (dataset kinds, noise kinds, methods) declares the
schema of its own entries, validated where a stage uses one. The rules that
span the whole file (every method a module of the catalog, no two runs in one
folder, every study's sections) are :mod:`noisydml.tools.check`'s, which
the launcher and CI run before anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from noisydml.schema import (
    SECTION_OWNERS, TOP_LEVEL, ErrorCollector, Field, ParamsError, ParamsErrors, check_choice, check_section,
    section_check,
)

__all__ = ["Field", "ParamsError", "check_section", "load_params", "validate_params"]


def sections_with_needs(sections) -> list[str]:
    """``sections`` and every section they need, in an order where each comes after what it needs."""
    ordered: list[str] = []

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in ordered:
            return
        if name in path:
            raise RuntimeError(f"params sections need each other in a cycle: {' -> '.join((*path, name))}")
        check = section_check(name)
        for need in (*check.needs, *check.reads):
            visit(need, (*path, name))
        ordered.append(name)

    for name in sections:
        if name not in SECTION_OWNERS:
            raise ParamsError(f"params: unknown section {name!r}; allowed: {', '.join(TOP_LEVEL)}")
        visit(name, ())
    return ordered


def validate_params(raw: Any, sections=None) -> dict[str, Any]:
    """Validate the shape of params.yaml and ``sections`` (top-level names; None: every section), with the
    sections they need; return those sections only, validated, with defaults filled in. Every problem found is
    raised at once (:class:`noisydml.schema.ParamsErrors`; :func:`validate_sections`).

    A stage validates, and can read, only the sections it loads: what a registry owns inside them (a dataset's,
    a noise setting's or a method's own keys, the backbone name) is validated by the stage that uses it, with that
    registry, so a stage imports (and DVC tracks) only the code it runs. :func:`noisydml.tools.check.check_all`
    validates everything at once, with the rules that span sections (``noisydml check``; the launcher, CI and the
    tests run it).
    """
    p, errors = validate_sections(raw, sections)
    errors.raise_if_any()
    return p


def validate_sections(raw: Any, sections=None) -> tuple[dict[str, Any], ErrorCollector]:
    """:func:`validate_params`, keeping going: the sections that validated, and every problem found (a section
    whose needed section failed is not checked: its problem is that one's)."""
    errors = ErrorCollector()
    if not isinstance(raw, Mapping):
        raise ParamsError(f"params: expected a mapping at the top level, got {type(raw).__name__}")
    for key in sorted(set(raw) - set(TOP_LEVEL)):
        with errors.check():
            check_choice(key, TOP_LEVEL, "params", "top-level key")
    for key in TOP_LEVEL:
        if key not in raw and key != "method_sets":  # named lists, for YAML anchors: may be left out
            errors.messages.append(f"params: missing required section {key!r} (no hidden defaults: every section "
                                   "is written out in params.yaml)")
    p: dict[str, Any] = {}
    wanted = sections_with_needs(TOP_LEVEL if sections is None else sections)
    for name in wanted:
        check = section_check(name)
        key = check.source or name
        if check.source and check.source in wanted:
            continue  # the whole section is loaded too
        if name not in raw and name in TOP_LEVEL and name != "method_sets":
            continue  # said above
        if any((section_check(need).source or need) not in p for need in check.needs):
            continue  # a section it reads failed: that one's problem is reported
        with errors.check():
            p[key] = check.check(raw.get(key), p, raw)
    return p, errors


def read_params_file(path: str | Path) -> Any:
    """A params file as DVC reads it: YAML 1.2 (``3e-05`` is a float, as ``dvc exp run -S`` writes it; PyYAML's
    YAML 1.1 reads it as a string) by ruamel.yaml's safe loader, the one DVC uses, which refuses a key written
    twice in one mapping (PyYAML keeps the last)."""
    from ruamel.yaml import YAML
    from ruamel.yaml.constructor import DuplicateKeyError
    from ruamel.yaml.error import YAMLError

    path = Path(path)
    if not path.is_file():
        raise ParamsError(f"{path}: no such file; run from the repository root or name the params file")
    try:
        return YAML(typ="safe").load(path.read_text())
    except DuplicateKeyError as e:
        raise ParamsError(f"{path}: a key is written twice in one mapping (DVC refuses the file too): "
                          f"{e.problem} {e.problem_mark}".strip()) from None
    except YAMLError as e:
        raise ParamsError(f"{path}: not valid YAML: {e}") from None


def load_params(path: str | Path = "params.yaml", sections=None) -> dict[str, Any]:
    """Read (:func:`read_params_file`) and validate (:func:`validate_params`) ``sections`` of params.yaml (None:
    every section)."""
    raw = read_params_file(path)
    try:
        return validate_params(raw, sections)
    except ParamsErrors as e:
        raise ParamsErrors(e.messages, prefix=f"{path}: ") from None
    except ParamsError as e:
        raise ParamsError(f"{path}: {e}") from None
