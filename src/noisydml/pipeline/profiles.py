"""Paper profiles: the params overrides that reproduce one paper table (``profiles/<paper>.yaml``).

A profile is a set of ``dvc exp run -S key=value`` overrides (dotted keys into params.yaml), the table it
reproduces, its number of runs and the GPU hours per run the estimate is made from. ``python
scripts/paper_profile.py`` lists them, checks them against params.yaml and prints (or runs) the command.
No stage imports this module.
"""

from __future__ import annotations

import copy
import shlex
from pathlib import Path

import yaml

from noisydml.schema import ParamsError


def load_profiles(folder: str | Path = "profiles") -> dict[str, dict]:
    """``{"<paper>/<profile>": {"table", "set", "runs", "gpu_hours_per_run"}}`` of every profile file."""
    out = {}
    for path in sorted(Path(folder).glob("*.yaml")):
        body = yaml.safe_load(path.read_text()) or {}
        for name, profile in (body.get("profiles") or {}).items():
            missing = {"table", "set", "runs", "gpu_hours_per_run"} - set(profile)
            if missing:
                raise ParamsError(f"{path}: profile {name!r} lacks {sorted(missing)}")
            out[f"{path.stem}/{name}"] = profile
    return out


def apply_overrides(params: dict, overrides: dict) -> dict:
    """A copy of ``params`` with each dotted key set, as ``dvc exp run -S`` would (the key's parent must exist)."""
    out = copy.deepcopy(params)
    for dotted, value in overrides.items():
        *parents, last = dotted.split(".")
        node = out
        for i, key in enumerate(parents):
            if not isinstance(node, dict) or key not in node:
                raise ParamsError(f"profile override {dotted!r}: params.yaml has no {'.'.join(parents[:i + 1])!r}")
            node = node[key]
        node[last] = copy.deepcopy(value)
    return out


def _yaml_value(value) -> str:
    """``value`` as one line of YAML (flow style), as ``-S`` parses it."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
    return text.removesuffix("...").strip()


def exp_command(name: str, profile: dict) -> str:
    """The ``dvc exp run`` command line of a profile."""
    flags = [f"-S {shlex.quote(f'{k}={_yaml_value(v)}')}" for k, v in profile["set"].items()]
    exp_name = name.replace("/", "-").replace("_", "-")
    return " \\\n  ".join([f"dvc exp run -n {exp_name}", *flags])
