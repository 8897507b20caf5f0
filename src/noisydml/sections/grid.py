"""``grid``: the datasets, noise settings, methods and seeds the pipeline trains, each a name defined in its
section; and the checks of a stage's grid item (``--dataset/--noise/--method/--seed``)."""

from __future__ import annotations

from typing import Any, Mapping

from noisydml.schema import (
    ErrorCollector, Field, ParamsError, SectionCheck, check_choice, check_section, check_unique, did_you_mean, flow,
)


GRID_SCHEMA = {
    "datasets": Field(list, item_type=str),
    "noises": Field(list, item_type=str),
    "run_noises": Field(list, [], item_type=str,
                        help="noise settings clustered on a grid run's embeddings (features.source: run); each "
                             "dataset's run is named in noise_runs.<dataset>-<noise>"),
    "methods": Field(list, item_type=str),
    "seeds": Field(list, [0], item_type=int, min=0),
}


def noises_of(grid: Mapping) -> list[str]:
    """Every noise setting the grid trains on: ``grid.noises`` then ``grid.run_noises``."""
    return list(grid["noises"]) + list(grid.get("run_noises", []))


def clusters_a_run(noise_setting: Mapping) -> bool:
    """Whether a noise setting's labels are made from a run's embeddings (``features.source: run``)."""
    features = noise_setting.get("features")
    return isinstance(features, Mapping) and features.get("source") == "run"


def _check_run_noises(grid: dict, noise: dict) -> None:
    """Noise made from a run's embeddings has its own DVC stages (``corrupt_from_run``, ``train_on_run_noise``)
    whose dependency on that run DVC can see; the data-only noises of ``grid.noises`` have none."""
    for i, name in enumerate(grid["noises"]):
        if clusters_a_run(noise[name]):
            raise ParamsError(
                f"grid.noises[{i}]: {name!r} is clustered on a run's embeddings (features.source: run); list it in "
                "grid.run_noises instead and name its run per dataset in noise_runs.<dataset>-<noise>")
    check_unique(grid["run_noises"], "grid.run_noises")
    for i, name in enumerate(grid["run_noises"]):
        check_choice(name, list(noise), f"grid.run_noises[{i}]", "noise setting")
        if not clusters_a_run(noise[name]):
            raise ParamsError(f"grid.run_noises[{i}]: {name!r} is not clustered on a run's embeddings "
                              "(features.source: run); list it in grid.noises")


def unknown_noise(name: Any, defined: Mapping[str, Any], where: str) -> str:
    """The refusal of a noise setting ``name`` that ``noise`` does not define: a near miss only among the
    settings of the same family (``sym30`` is not a typo of ``sympc30``, another kind), and how to define it,
    from its family's definition where there is one (``sym30``: ``sym50``'s with rate 0.3)."""
    import re

    def family(n: Any) -> str:
        match = re.match(r"[A-Za-z_]*?(?=\d|$)", str(n))
        return match.group(0) if match else str(n)

    kin = [n for n in defined if family(n) == family(name)]
    digits = re.search(r"(\d+)$", str(name))
    template = next((defined[n] for n in kin if isinstance(defined[n], Mapping) and "rate" in defined[n]), None)
    if template is not None and digits and 0 < int(digits.group(1)) < 100:  # a rate of a family: no near miss
        body = {**template, "rate": int(digits.group(1)) / 100}
        return (f"{where}: unknown noise setting {name!r}; defined: {', '.join(sorted(defined))}; define it first, "
                f"as {kin[0]} is: -S '+noise.{name}={flow(body)}'")
    else:
        how = "define it first: -S '+noise.{name}={{kind: ..., ...}}' (README \"Changing the grid\")".format(name=name)
    return (f"{where}: unknown noise setting {name!r}{did_you_mean(name, kin)}; defined: "
            f"{', '.join(sorted(defined)) or '(none)'}; {how}")


def _check_grid(section: Any, p: dict[str, Any], raw: Mapping[str, Any]) -> dict[str, Any]:
    """``grid``: every name must be defined in its section of the file (the sections themselves are validated by
    the stages that load them); every problem at once."""
    grid = check_section(section, GRID_SCHEMA, "grid")
    errors = ErrorCollector()
    for key, defined, what in (("datasets", "datasets", "dataset"), ("noises", "noise", "noise setting"),
                               ("methods", "methods", "method")):
        with errors.check():
            if not grid[key]:
                raise ParamsError(f"grid.{key}: must list at least one {what}; allowed: names defined in `{defined}`")
            check_unique(grid[key], f"grid.{key}")
        names = list(raw[defined]) if isinstance(raw.get(defined), Mapping) else []
        for i, name in enumerate(grid[key]):
            with errors.check():
                if key == "noises" and name not in names:
                    raise ParamsError(unknown_noise(name, raw.get("noise") or {}, f"grid.noises[{i}]"))
                check_choice(name, names, f"grid.{key}[{i}]", what)
    with errors.check():
        if not grid["seeds"]:
            raise ParamsError("grid.seeds: [] trains nothing; allowed: a non-empty list of seeds, e.g. [0] or [0, 1, 2]")
        check_unique(grid["seeds"], "grid.seeds")
    errors.raise_if_any()  # the rule below reads the noise settings the grid names
    _check_run_noises(grid, raw["noise"])
    return grid


#: Command-line option -> (the grid list it must be in, its type).
GRID_KEYS = {"dataset": ("datasets", str), "noise": ("noises", str), "method": ("methods", str), "seed": ("seeds", int)}


def check_in_grid(params: dict, **names) -> None:
    """Refuse to run an item that params.yaml's grid does not list (a stale stage name, a typo).

    A noise is in the grid when it is in ``grid.noises`` or ``grid.run_noises``, or (made but not trained on)
    when ``noise_runs`` has an entry for it on the dataset."""
    grid = params["grid"]
    for key, value in names.items():
        section = GRID_KEYS[key][0]
        allowed = noises_of(grid) if key == "noise" else grid[section]
        if key == "noise" and f"{names.get('dataset')}-{value}" in params["noise_runs"]:
            continue
        if value not in allowed:
            where = "grid.noises or grid.run_noises" if key == "noise" else f"grid.{section}"
            raise ParamsError(f"--{key} {value!r} is not in {where} ({allowed})")


#: The section this module validates (:data:`noisydml.schema.SECTION_OWNERS`).
SECTION_CHECKS: dict[str, SectionCheck] = {
    "grid": SectionCheck(_check_grid),
}
