"""The study catalog: a study is a module ``noisydml/studies/<name>.py`` with a ``STUDY`` (:mod:`.base`).

Listed from the files of this folder without importing them, and imported by name: the train stage of a study's
run imports that study only (its DVC dependencies follow), the evaluate and report stages all of them. Adding a
study file re-runs no grid run.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from noisydml.catalog import load_member, names_in
from noisydml.runs import find_runs, runs_of
from noisydml.schema import ParamsError

#: Modules of this package that are not studies.
_NOT_STUDIES = {"__init__", "base"}


def study_names() -> list[str]:
    """Every study of the catalog: the ``*.py`` files of this folder, sorted."""
    return names_in(Path(__file__).parent, _NOT_STUDIES)


def load_study(name: str):
    """The :class:`~noisydml.studies.base.Study` of ``name`` (imports its module only)."""
    return load_member("noisydml.studies", name, study_names(), "STUDY", "study")


def section_owners() -> dict[str, str]:
    """``figures.<key>`` -> the study that owns it (imports every study)."""
    owners: dict[str, str] = {}
    for name in study_names():
        for key in load_study(name).sections:
            owners.setdefault(key, name)
    return owners


def check_study(params: dict[str, Any], name: str) -> dict[str, Any]:
    """The ``figures`` sections study ``name`` owns, validated (each must be written in params.yaml); params are
    left as they are."""
    study = load_study(name)
    figures = params["figures"]
    out = {}
    for key, check in study.sections.items():
        if key not in figures:
            raise ParamsError(f"figures: missing section {key!r} of study {name!r} (no hidden defaults: every "
                              "section is written out in params.yaml)")
        out[key] = check(copy.deepcopy(figures[key]), params)
    return out


def check_studies(params: dict[str, Any]) -> dict[str, Any]:
    """Validate every study's sections and refuse ``figures`` sections no study owns; return params as they are
    (``figures`` stays as written: a study validates its sections again wherever they are used,
    :func:`check_study`). That no two runs share a folder is :mod:`noisydml.tools.check`'s rule."""
    owners = section_owners()
    unknown = [key for key in params["figures"] if key not in owners]
    if unknown:
        raise ParamsError(f"figures: unknown section {unknown[0]!r}; allowed: {', '.join(sorted(owners))} "
                          "(each owned by a study)")
    for name in study_names():
        check_study(params, name)
    return params


def study_runs(params: dict[str, Any], name: str) -> list:
    """The own runs of study ``name`` (its sections validated first)."""
    study = load_study(name)
    runs = study.runs(params, check_study(params, name))
    undeclared = sorted({run.kind.name for run in runs if run.kind not in study.kinds})
    if undeclared:
        raise TypeError(f"study {name!r} returns runs of kinds it does not declare (Study.kinds): {undeclared}")
    return runs


def all_runs(params: dict[str, Any]) -> list:
    """The grid's and the chains' runs, then every study's own runs."""
    runs = runs_of(params)
    for name in study_names():
        runs += study_runs(params, name)
    return runs


def find_study_runs(params: dict[str, Any], folder: str, study: str | None) -> list:
    """The runs at or under ``folder`` (:func:`noisydml.runs.find_runs`): of the grid or the chains, or
    (``study``) of that study's own runs."""
    if study is None:
        return find_runs(runs_of(params), folder, "params.yaml")
    return find_runs(study_runs(params, study), folder, f"study {study!r}")
