"""Runs are values: every training run params.yaml asks for, as a :class:`Run`.

This module is the only place that expands params into runs and names them: the run folder
``runs/<dataset>/<noise>/<name>/seed<k>`` (which the train stage is given as ``--run``, and which dvc.yaml declares
as the stage's output: DVC's templates cannot call Python, so tests/test_runs.py checks the two agree), the DVC
stage that trains it, and the overrides it trains with. The train stage, the evaluate stage and the report take
runs from here; nothing decodes a folder name back into settings.

Kinds of run: the grid (datasets x noises x methods x seeds), chained runs (``chains``: trained from another run),
and the figures' own runs (``figures.embedding_size`` points, ``figures.bspml_cells`` cells,
``figures.sgps_ablations`` variants). Light: no torch; it reads validated params only.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, Mapping

from noisydml.schema import ParamsError


@dataclass(frozen=True)
class Run:
    """One training run: what trains, on what, with which overrides, and where it lives."""

    kind: str  # grid | chain | embedding_size | bspml_cell | sgps_ablation
    stage: str  # the DVC stage that trains it
    dataset: str
    noise: str
    name: str  # its folder under runs/<dataset>/<noise>/, its row in the report
    seed: int
    method: str  # methods.<method> holds its hyper-parameters
    #: Overrides of ``methods.<method>`` for this run only (a nested section is merged key by key).
    hparams: dict[str, Any] = field(default_factory=dict)
    #: Overrides of ``train`` for this run only.
    train: dict[str, Any] = field(default_factory=dict)
    #: A chained run's entry of ``chains`` (upstream, init, labels, inputs); None for every other kind.
    chain: dict[str, Any] | None = None
    #: Where the run sits in its figure or table: ``embedding_dim``; ``lambda`` and ``mu``; ``variant`` and
    #: ``group`` (the report reads these, never the folder name).
    point: dict[str, Any] = field(default_factory=dict)

    @property
    def folder(self) -> str:
        """``runs/<dataset>/<noise>/<name>/seed<k>``, relative to the repository root."""
        return str(PurePosixPath("runs", self.dataset, self.noise, self.name, f"seed{self.seed}"))

    @property
    def run_name(self) -> str:
        """``<dataset>-<noise>-<name>-<seed>``: its MLflow run name and its key in reports/metrics.json's runs."""
        return run_name(self.dataset, self.noise, self.name, self.seed)

    def params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """``params`` as this run trains with them: its train and method overrides applied."""
        method = dict(params["methods"][self.method])
        for key, value in self.hparams.items():
            nested = isinstance(value, Mapping) and isinstance(method.get(key), Mapping)
            method[key] = {**method[key], **value} if nested else value
        return {**params, "train": {**params["train"], **self.train},
                "methods": {**params["methods"], self.method: method}}


def run_name(dataset: str, noise: str, name: str, seed: int) -> str:
    """The name of one training run, as DVC's matrix names a grid run (``train@<run_name>``)."""
    return f"{dataset}-{noise}-{name}-{seed}"


def noises_of(grid: Mapping) -> list[str]:
    """Every noise setting the grid trains on: ``grid.noises`` then ``grid.run_noises``."""
    return list(grid["noises"]) + list(grid.get("run_noises", []))


def runs_of(params: Mapping[str, Any]) -> list[Run]:
    """Every run of (validated) params, in pipeline order: the grid, the chains, the figures' own runs."""
    grid = params["grid"]
    runs = [Run("grid", f"{'train' if n in grid['noises'] else 'train_on_run_noise'}@{run_name(d, n, m, s)}",
                d, n, m, s, m)
            for d, n, m, s in itertools.product(grid["datasets"], noises_of(grid), grid["methods"], grid["seeds"])]
    runs += [Run("chain", f"train_chain@{key}", c["dataset"], c["noise"], c["name"], c["seed"], c["method"],
                 hparams=c["hparams"], train=c["train"], chain=c)
             for key, c in params["chains"].items()]
    figures = params["figures"]
    sizes = figures["embedding_size"]
    runs += [Run("embedding_size", f"train_embedding_size@{m}-{dim}-{s}", sizes["dataset"], sizes["noise"],
                 f"{m}_dim{dim}", s, m, train={"embedding_dim": dim}, point={"embedding_dim": dim})
             for m, dim, s in itertools.product(sizes["methods"], sizes["dims"], sizes["seeds"])]
    cells = figures["bspml_cells"]
    # the lambda and mu of a cell are named as DVC writes them in the stage's name and path (Python's str of the
    # YAML value: 3.1, 20), so both name the same folder; the age is held: lambda_0 = lambda_inf = lambda, c = 1
    for (lam_name, lam), (mu_name, mu), s in itertools.product(zip(cells["lambda_names"], cells["lambdas"]),
                                                              zip(cells["mu_names"], cells["mus"]), cells["seeds"]):
        runs.append(Run("bspml_cell", f"train_bspml_cell@{lam_name}-{mu_name}-{s}", cells["dataset"], cells["noise"],
                        f"bspml_lam{lam_name}_mu{mu_name}", s, "bspml",
                        hparams={"lambda_0": lam, "lambda_inf": lam, "age_multiplier": 1.0, "mu": mu},
                        point={"lambda": lam, "mu": mu}))
    ablations = figures["sgps_ablations"]
    runs += [Run("sgps_ablation", f"train_sgps_ablation@{v}-{s}", ablations["dataset"], ablations["noise"], f"sgps_{v}",
                 s, "sgps", hparams=ablations["variants"][v]["hparams"],
                 point={"variant": v, "group": ablations["variants"][v]["group"]})
             for v, s in itertools.product(ablations["train"], ablations["seeds"])]
    return runs


def check_unique_folders(runs: list[Run]) -> None:
    """Two runs never share a folder (a chain or a figure's run named like another run)."""
    seen: dict[str, Run] = {}
    for run in runs:
        if run.folder in seen:
            raise ParamsError(f"{run.stage} and {seen[run.folder].stage} would both write {run.folder}: rename one "
                              "(a chain's name, a figure's method or variant)")
        seen[run.folder] = run


def find_run(params: Mapping[str, Any], folder: str) -> Run:
    """The run of params whose folder is ``folder`` (the train stage's ``--run``)."""
    runs = runs_of(params)
    wanted = str(PurePosixPath(folder))
    for run in runs:
        if run.folder == wanted:
            return run
    near = [r.folder for r in runs if r.dataset in wanted and r.noise in wanted][:5]
    raise ParamsError(f"--run {folder!r} is not a run of params.yaml ({len(runs)} runs"
                      + (f"; e.g. {', '.join(near)}" if near else "") + ")")
