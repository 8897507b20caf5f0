"""Runs are values: every training run params.yaml asks for, as a :class:`Run`.

This module is the only place that expands params into runs and names them: the run folder
``runs/<dataset>/<noise>/<name>/seed<k>`` (which the train stage is given as ``--run-folder``, and which dvc.yaml declares
as the stage's output: DVC's templates cannot call Python, so tests/test_runs.py checks the two agree), the DVC
stage that trains it, and the overrides it trains with. The train stage, the evaluate stage and the report take
runs from here; nothing decodes a folder name back into settings.

Tuned runs are named here too (``<method>_tuned``, from ``tuning/<dataset>/<noise>/<method>/chosen.json``); the
search that chooses their values is :mod:`noisydml.tuning`'s.

Kinds of run here: the grid (datasets x noises x methods x seeds), chained runs (``chains``: trained from
another run, at every seed of the grid unless the chain names its seeds) and tuned runs (``tuning``: a method with
the values its tune stage chose, :mod:`noisydml.tuning`, at every seed of the grid; a tuned chain at its seeds). A study (:mod:`noisydml.studies`) returns its own runs as the same values (e.g. ``embedding_size``
points, ``bspml_cell`` cells, ``sgps_ablation`` variants). Light: no torch; it reads validated params only.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, Mapping

from noisydml.sections.grid import noises_of
from noisydml.schema import (PER_NOISE, Field, ParamsError, SectionCheck, check_choice, check_section, check_unique,
                             merged)

#: A tuned run's name: its method's, with this suffix (its folder runs/<dataset>/<noise>/<method>_tuned/seed<k>).
TUNED_SUFFIX = "_tuned"
#: The tune stage's output folder, per study: ``tuning/<dataset>/<noise>/<method>/``.
TUNING_ROOT = "tuning"
#: The file of that folder the tuned runs read (and depend on): ``{"values": {key: value}}``.
CHOSEN_FILE = "chosen.json"
#: The keys of params.yaml's ``tuning`` that name the tuned runs (the rest, the search, is :mod:`noisydml.tuning`'s).
TUNED_RUNS_SCHEMA = {
    "datasets": Field(list, item_type=str, help="datasets tuned on (of grid.datasets)"),
    "noises": Field(list, item_type=str, help="noise settings tuned on (of grid.noises)"),
    "methods": Field(list, item_type=str, help="methods tuned (each needs tuning.spaces.<method>); [] = no tuning"),
    "chains": Field(list, item_type=str, help="chained runs tuned, by name (chains.<key>.name, at every dataset x noise "
                                              "tuned; the space is its method's); [] = none"),
}


@dataclass(frozen=True)
class RunKind:
    """A kind of run and the dvc.yaml stage template that trains it: a run's stage is ``<template>@<key>``, never
    written by hand. The pipeline's kinds are below; a study declares its own (:attr:`noisydml.studies.base.Study.kinds`,
    e.g. ``embedding_size``, ``bspml_cell``, ``sgps_ablation``): a value type, not an Enum, so that adding a study
    edits no other module."""

    name: str  # the report's ``run_kind``: grid | chain | tuned | a study's
    template: str  # the dvc.yaml stage (a foreach/matrix template) whose item trains the run

    def stage(self, key: str) -> str:
        """The DVC stage of the template's item ``key``."""
        return f"{self.template}@{key}"


GRID = RunKind("grid", "train")
#: a grid run on labels made from another run's embeddings (its own template: it depends on that run)
GRID_ON_RUN_NOISE = RunKind("grid", "train_on_run_noise")
CHAIN = RunKind("chain", "train_chain")
TUNED = RunKind("tuned", "train_tuned")
TUNED_CHAIN = RunKind("tuned", "train_tuned_chain")
#: a ``timing.entries`` entry: epochs timed, nothing kept (its stage writes timing/<entry>.json)
TIMING = RunKind("timing", "timing")


@dataclass(frozen=True)
class Run:
    """One training run: what trains, on what, with which overrides, and where it lives."""

    kind: RunKind
    key: str  # its item of the kind's template: the run's DVC stage is ``kind.template@key``
    dataset: str
    noise: str
    name: str  # its folder under runs/<dataset>/<noise>/, its row in the report
    seed: int
    method: str  # methods.<method> holds its hyper-parameters
    #: Overrides of ``methods.<method>`` for this run only (a nested section is merged key by key).
    hparams: dict[str, Any] = field(default_factory=dict)
    #: Overrides of ``train`` for this run only.
    train: dict[str, Any] = field(default_factory=dict)
    #: A chained run's entry of ``chains`` (upstream, init, labels, inputs), with its ``key`` and this run's
    #: ``seed``; None for every other kind.
    chain: dict[str, Any] | None = None
    #: Where the run sits in its figure or table: ``embedding_dim``; ``lambda`` and ``mu``; ``variant`` and
    #: ``group`` (the report reads these, never the folder name).
    point: dict[str, Any] = field(default_factory=dict)
    #: A tuned run's ``tuning/<dataset>/<noise>/<method>/chosen.json`` (its tune stage's output: the values it
    #: trains with, read by the train stage); None for every other kind.
    chosen: str | None = None

    @property
    def stage(self) -> str:
        """The DVC stage that trains it."""
        return self.kind.stage(self.key)

    @property
    def folder(self) -> str:
        """``runs/<dataset>/<noise>/<name>/seed<k>``, relative to the repository root."""
        return str(PurePosixPath("runs", self.dataset, self.noise, self.name, f"seed{self.seed}"))

    @property
    def run_name(self) -> str:
        """``<dataset>-<noise>-<name>-<seed>``: its MLflow run name and its key in reports/metrics.json's runs."""
        return run_name(self.dataset, self.noise, self.name, self.seed)

    def params(self, params: Mapping[str, Any], values: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """``params`` as this run trains with them: its method's settings for its noise
        (``methods.<method>.per_noise.<noise>``, then removed), its own method and train overrides (a nested section
        is merged key by key), then ``values`` (space key -> value: a tuned run's chosen values, a trial's) set at
        their paths (:func:`split_key`). The one place overrides are merged: the train, tune, timing and check
        stages and the studies all read a run's params here."""
        section = dict(params["methods"][self.method])
        per_noise = section.pop(PER_NOISE, None) or {}
        section = merged(merged(section, per_noise.get(self.noise, {})), self.hparams)
        out = {**params, "train": {**params["train"], **self.train}, "methods": {**params["methods"], self.method: section}}
        if values:
            out = copy.deepcopy(out)
            for key, value in values.items():
                *head, last = split_key(self.method, key)
                node = out
                for part in head:
                    node = node[part]
                node[last] = value
        return out


def split_key(method: str, key: str) -> tuple[str, ...]:
    """A space key as a path in params: ``train.<...>`` in train, anything else in ``methods.<method>``."""
    parts = tuple(key.split("."))
    return parts if parts[0] == "train" else ("methods", method, *parts)


def run_name(dataset: str, noise: str, name: str, seed: int) -> str:
    """The name of one training run, as DVC's matrix names a grid run (``train@<run_name>``)."""
    return f"{dataset}-{noise}-{name}-{seed}"


def runs_of(params: Mapping[str, Any]) -> list[Run]:
    """The grid's runs, the chained runs and, where params hold the ``tuning`` section (a stage that loads it), the
    tuned runs (methods and chains) of (validated) params; the studies add their own runs
    (:func:`noisydml.studies.all_runs`)."""
    grid = params["grid"]
    runs = [Run(GRID if n in grid["noises"] else GRID_ON_RUN_NOISE, run_name(d, n, m, s), d, n, m, s, m)
            for d, n, m, s in itertools.product(grid["datasets"], noises_of(grid), grid["methods"], grid["seeds"])]
    return runs + chain_runs(params) + tuned_runs_of(params)


def tuned_runs_of(params: Mapping[str, Any]) -> list[Run]:
    """The tuned runs: of the methods tuned, then of the chains tuned (none where params hold no ``tuning``)."""
    return tuned_runs(params) + tuned_chain_runs(params)


def tuned_runs(params: Mapping[str, Any]) -> list[Run]:
    """Each tuning study's method trained with the values it chose (``chosen.json``, its tune stage's output) on
    the full training set, at every seed of the grid: run ``<method>_tuned``, stage
    ``train_tuned@<dataset>-<noise>-<method>-<seed>``. None without a ``tuning`` section (e.g. a study's own params)."""
    if "tuning" not in params:
        return []
    return [Run(TUNED, run_name(d, n, m, s), d, n, m + TUNED_SUFFIX, s, m,
                chosen=f"{tuning_folder(d, n, m)}/{CHOSEN_FILE}")
            for d, n, m in tunings_of(params) for s in params["grid"]["seeds"]]


def tuned_chain_runs(params: Mapping[str, Any]) -> list[Run]:
    """Each chained run tuned (``tuning.chains``) trained with the values its study chose (``chosen.json`` of
    stage ``tune_chain@<dataset>-<noise>-<name>``), from the same upstream as the untuned chain, at the chain's
    seeds: run ``<name>_tuned``, one stage ``train_tuned_chain@<dataset>-<noise>-<name>`` for its seeds."""
    if "tuning" not in params:
        return []
    runs = []
    for d, n, name in chain_tunings_of(params):
        key, c = find_chain(params["chains"], d, n, name, "tuning.chains")
        runs += [Run(TUNED_CHAIN, f"{d}-{n}-{name}", d, n, name + TUNED_SUFFIX, seed, c["method"],
                     hparams=c["hparams"], train=c["train"], chain={**c, "key": key, "seed": seed},
                     chosen=f"{tuning_folder(d, n, name)}/{CHOSEN_FILE}")
                 for seed in c["seeds"]]
    return runs


def chain_runs(params: Mapping[str, Any]) -> list[Run]:
    """The chained runs: each entry of ``chains`` at each of its seeds (every grid seed unless it names seeds).
    One DVC stage, ``train_chain@<key>``, trains an entry's seeds into ``runs/<dataset>/<noise>/<name>/``."""
    return [chain_run(key, c, seed) for key, c in params["chains"].items() for seed in c["seeds"]]


def chain_run(key: str, chain: Mapping[str, Any], seed: int) -> Run:
    """The chained run of ``chains.<key>`` at ``seed``."""
    return Run(CHAIN, key, chain["dataset"], chain["noise"], chain["name"], seed, chain["method"],
               hparams=chain["hparams"], train=chain["train"], chain={**chain, "key": key, "seed": seed})


def chain_params(params: Mapping[str, Any], chain: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` as a chained run (an entry of ``chains``, with its ``key``) trains with them (:meth:`Run.params`)."""
    return chain_run(chain.get("key", ""), chain, 0).params(params)


def find_chain(chains: Mapping[str, dict], dataset: str, noise: str, name: str, where: str) -> tuple[str, dict]:
    """The entry of (validated) ``chains`` named ``name`` at ``dataset``/``noise``: ``(key, entry)``."""
    for key, chain in chains.items():
        if (chain["dataset"], chain["noise"], chain["name"]) == (dataset, noise, name):
            return key, chain
    there = sorted({c["name"] for c in chains.values() if (c["dataset"], c["noise"]) == (dataset, noise)})
    raise ParamsError(f"{where}: {name!r} is no chained run of {dataset}/{noise} (chains there: "
                      f"{', '.join(there) or 'none'}); a tuned chain needs an entry of chains with that name at every "
                      "dataset and noise of tuning.datasets x tuning.noises")


def lineage(chains: Mapping[str, dict], dataset: str, noise: str, name: str) -> tuple[str, list[tuple[str, dict]]]:
    """What a chained run is trained after: ``(the grid method it starts from, [(key, entry), ...])``, the chains
    from the first after that method to ``name``'s own entry (last)."""
    steps: list[tuple[str, dict]] = []
    names = {c["name"] for c in chains.values() if (c["dataset"], c["noise"]) == (dataset, noise)}
    current = name
    while current in names:
        key, chain = find_chain(chains, dataset, noise, current, f"chains ({name!r}'s upstreams)")
        steps.insert(0, (key, chain))
        current = chain["upstream"]
    return current, steps


def tuning_name(dataset: str, noise: str, method: str) -> str:
    """``<dataset>-<noise>-<method>``: the tune stage's matrix key (``tune@<tuning_name>``)."""
    return f"{dataset}-{noise}-{method}"


def tuning_folder(dataset: str, noise: str, method: str) -> str:
    """The tune stage's output, relative to the repository root."""
    return f"{TUNING_ROOT}/{dataset}/{noise}/{method}"


def tunings_of(params: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """Every (dataset, noise, method) tuning study, in the tune stage's matrix order."""
    t = params["tuning"]
    return [(d, n, m) for d in t["datasets"] for n in t["noises"] for m in t["methods"]]


def chain_tunings_of(params: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """Every (dataset, noise, chain name) tuning study, in the tune_chain stage's matrix order."""
    t = params["tuning"]
    return [(d, n, c) for d in t["datasets"] for n in t["noises"] for c in t["chains"]]


def check_tuned_runs(section: Any, p: dict[str, Any], raw: Mapping[str, Any]) -> dict[str, list]:
    """The keys of ``tuning`` that name the tuned runs (:data:`TUNED_RUNS_SCHEMA`), as naming them needs: where to
    tune (checked only when something is tuned: a grid without sc50 keeps tuning.noises as written), what, and a
    chain of each tuned name at every dataset x noise tuned. The stages that only list the tuned runs (evaluate,
    report) load this view of the section (``tuned_runs``); the whole section is :mod:`noisydml.tuning`'s."""
    t = check_section({k: v for k, v in (section or {}).items() if k in TUNED_RUNS_SCHEMA}, TUNED_RUNS_SCHEMA, "tuning")
    tuned = t["methods"] or t["chains"]
    for key, allowed, what, note in (
            ("datasets", p["grid"]["datasets"], "dataset", " (the datasets of grid.datasets)"),
            ("noises", p["grid"]["noises"], "noise setting", " (the noise settings of grid.noises: their labels are made)"),
            ("methods", list(raw["methods"]), "method", " (the entries of the `methods` section)")):
        check_unique(t[key], f"tuning.{key}")
        for i, name in enumerate(t[key] if tuned else []):
            check_choice(name, allowed, f"tuning.{key}[{i}]", what, note)
    check_unique(t["chains"], "tuning.chains")
    if tuned and not (t["datasets"] and t["noises"]):
        raise ParamsError("tuning: methods or chains are listed but tuning.datasets or tuning.noises is []; allowed: "
                          "at least one dataset and one noise setting to tune on")
    for i, name in enumerate(t["chains"]):
        for dataset in t["datasets"]:
            for noise in t["noises"]:
                find_chain(p["chains"], dataset, noise, name, f"tuning.chains[{i}]")
    return t


#: The view of ``tuning`` this module validates (:data:`noisydml.schema.SECTION_OWNERS`).
SECTION_CHECKS = {"tuned_runs": SectionCheck(check_tuned_runs, needs=("grid", "chains"), source="tuning")}


def check_unique_folders(runs: list[Run]) -> None:
    """Two runs never share a folder (a chain or a figure's run named like another run)."""
    seen: dict[str, Run] = {}
    for run in runs:
        if run.folder in seen:
            raise ParamsError(f"{run.stage} and {seen[run.folder].stage} would both write {run.folder}: rename one "
                              "(a chain's name, a figure's method or variant)")
        seen[run.folder] = run


def find_runs(runs: list[Run], folder: str, where: str) -> list[Run]:
    """The runs of ``runs`` (``where`` names them in the error) whose folder is ``folder`` or inside it: a seed
    folder is one run; a chained run's folder ``runs/<dataset>/<noise>/<name>`` is its seeds (the train stage's
    ``--run-folder``)."""
    wanted = PurePosixPath(folder)
    found = [run for run in runs if wanted == PurePosixPath(run.folder) or wanted in PurePosixPath(run.folder).parents]
    if not found:
        near = [r.folder for r in runs if r.dataset in str(wanted) and r.noise in str(wanted)][:5]
        raise ParamsError(f"--run-folder {folder!r} is not a run of {where} ({len(runs)} runs"
                          + (f"; e.g. {', '.join(near)}" if near else "") + ")")
    return found
