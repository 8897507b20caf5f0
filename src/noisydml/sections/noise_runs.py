"""``noise_runs``: the grid run whose training embeddings a run-sourced noise setting clusters."""

from __future__ import annotations

from typing import Any, Mapping

from noisydml.schema import Field, ParamsError, SectionCheck, check_choice, check_section, mapping_or_empty
from noisydml.sections.grid import clusters_a_run


#: Which run's embeddings a run-sourced noise setting clusters, on one dataset (``noise_runs.<dataset>-<noise>``):
#: the DVC stage ``corrupt_from_run@<dataset>-<noise>`` depends on that run's folder.
NOISE_RUN_SCHEMA = {
    "dataset": Field(str, help="a dataset of grid.datasets"),
    "noise": Field(str, help="a noise setting with features.source: run"),
    "run": Field(dict, help="{noise, method, seed}: the grid run (same dataset) whose training embeddings are clustered"),
}


NOISE_RUN_RUN_SCHEMA = {
    "noise": Field(str, help="a noise setting of grid.noises"),
    "method": Field(str, help="a method of grid.methods"),
    "seed": Field(int, min=0, help="a seed of grid.seeds"),
}


def _check_noise_runs(section: Any, p: dict[str, Any], raw: Mapping[str, Any]) -> dict[str, dict]:
    """``noise_runs.<dataset>-<noise>``: the grid run whose training embeddings a run-sourced noise clusters."""
    section = mapping_or_empty(section, "noise_runs", "'<dataset>-<noise>' -> {dataset, noise, run}")
    grid = p["grid"]
    entries: dict[str, dict] = {}
    for key, body in section.items():
        where = f"noise_runs.{key}"  # the key is checked against its dataset and noise below
        e = check_section(body, NOISE_RUN_SCHEMA, where)
        e["run"] = check_section(e["run"], NOISE_RUN_RUN_SCHEMA, f"{where}.run")
        check_choice(e["dataset"], grid["datasets"], f"{where}.dataset", "dataset of grid.datasets")
        check_choice(e["noise"], list(p["noise"]), f"{where}.noise", "noise setting")
        if not clusters_a_run(p["noise"][e["noise"]]):
            raise ParamsError(f"{where}.noise: {e['noise']!r} does not cluster a run's embeddings "
                              "(its features.source is not 'run')")
        expected = f"{e['dataset']}-{e['noise']}"
        if key != expected:
            raise ParamsError(f"{where}: the key must be {expected!r} ('<dataset>-<noise>'; it names the stage "
                              f"corrupt_from_run@{expected} and the folder data/noisy/{e['dataset']}/{e['noise']})")
        run = e["run"]
        for field, values in (("noise", grid["noises"]), ("method", grid["methods"]), ("seed", grid["seeds"])):
            if run[field] not in values:
                raise ParamsError(
                    f"{where}.run.{field}: {run[field]!r} is not in grid.{field}s ({values}): the run whose "
                    f"embeddings are clustered must be one the grid trains")
        entries[key] = e
    for name in grid["run_noises"]:
        for dataset in grid["datasets"]:
            if f"{dataset}-{name}" not in entries:
                raise ParamsError(
                    f"grid.run_noises: {name!r} on dataset {dataset!r} needs noise_runs.{dataset}-{name}: "
                    f"{{dataset: {dataset}, noise: {name}, run: {{noise: ..., method: ..., seed: ...}}}} "
                    "(the grid run whose embeddings it clusters)")
    return entries


#: The section this module validates (:data:`noisydml.schema.SECTION_OWNERS`).
SECTION_CHECKS: dict[str, SectionCheck] = {
    "noise_runs": SectionCheck(_check_noise_runs, needs=("grid", "noise")),
}
