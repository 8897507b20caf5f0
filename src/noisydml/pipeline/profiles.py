"""Paper profiles: the ``dvc exp run -S`` arguments that reproduce one paper table (``profiles/<paper>.yaml``).

A profile's ``set`` is the list of ``-S`` arguments exactly as DVC applies them (Hydra's override grammar: ``+`` adds
a key params.yaml lacks, ``~key`` removes one, a mapping value is merged into the mapping it replaces); lists
inside it (YAML anchors of shared settings) are flattened. With it: the table it reproduces, its number of runs and
the GPU hours per run the estimate is made from. ``python scripts/paper_profile.py`` lists them, checks them
through DVC's own override code and prints (or runs) the command. No stage imports this module.
"""

from __future__ import annotations

import shlex
import shutil
import tempfile
from pathlib import Path
from typing import Any

import yaml

from noisydml.schema import ParamsError


def _flatten(items: Any, where: str) -> list[str]:
    if not isinstance(items, list):
        raise ParamsError(f"{where}: expected a list of -S arguments, got {items!r}")
    out: list[str] = []
    for item in items:
        if isinstance(item, list):
            out += _flatten(item, where)
        elif isinstance(item, str):
            out.append(item)
        else:
            raise ParamsError(f"{where}: {item!r} is not a -S argument (a string 'key=value', '+key=value', '~key')")
    return out


def load_profiles(folder: str | Path = "profiles") -> dict[str, dict]:
    """``{"<paper>/<profile>": {"table", "set", "runs", "gpu_hours_per_run"}}`` of every profile file, ``set``
    flattened to the list of ``-S`` arguments."""
    out = {}
    for path in sorted(Path(folder).glob("*.yaml")):
        body = yaml.safe_load(path.read_text()) or {}
        for name, profile in (body.get("profiles") or {}).items():
            missing = {"table", "set", "runs", "gpu_hours_per_run"} - set(profile)
            if missing:
                raise ParamsError(f"{path}: profile {name!r} lacks {sorted(missing)}")
            out[f"{path.stem}/{name}"] = {**profile, "set": _flatten(profile["set"], f"{path}: {name}.set")}
    return out


def params_after(overrides: list[str], params: str | Path = "params.yaml") -> dict[str, Any]:
    """``params`` after ``dvc exp run -S`` applies ``overrides`` (DVC's own code, on a copy), read by the stages'
    loader and validated whole (:func:`noisydml.pipeline.check.check_all`)."""
    from dvc.exceptions import InvalidArgumentError
    from dvc.utils.hydra import apply_overrides

    from noisydml.config import load_params
    from noisydml.pipeline.check import check_all

    with tempfile.TemporaryDirectory() as folder:
        copy = Path(folder) / "params.yaml"
        shutil.copy(params, copy)
        try:
            apply_overrides(copy, overrides)
        except InvalidArgumentError as e:
            raise ParamsError(f"DVC refuses the overrides {overrides}: {e.__cause__ or e}") from None
        return check_all(load_params(copy))


def exp_command(name: str, profile: dict) -> str:
    """The ``dvc exp run`` command line of a profile."""
    flags = [f"-S {shlex.quote(item)}" for item in profile["set"]]
    exp_name = name.replace("/", "-").replace("_", "-")
    return " \\\n  ".join([f"dvc exp run -n {exp_name}", *flags])
