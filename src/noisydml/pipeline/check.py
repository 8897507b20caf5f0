"""Validate all of params.yaml at once: ``python -m noisydml.pipeline.check [params.yaml]``.

Each stage validates the sections it loads (:func:`noisydml.config.load_params`) and the registry entries it uses;
this checks every section, every dataset, noise setting and method entry, the backbone and the rules that span
sections (every method a module of the catalog, report metrics the evaluate stage computes, no two runs of any
kind in one folder, every study's sections), so a mistake in a section no stage of the grid uses yet is found too.
The launcher runs it before any stage, CI and the tests on the repository's params.yaml. No stage imports this
module: editing a rule here re-runs nothing.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from noisydml.config import load_params, validate_params
from noisydml.data.registry import DATASET_KINDS, check_dataset
from noisydml.evaluation import metric_names
from noisydml.methods import check_frozen_backbone, check_method, method_names
from noisydml.models import check_backbone
from noisydml.noise import check_noise
from noisydml.pipeline.job import check_run_params
from noisydml.pipeline.timing import timing_run
from noisydml.runs import chain_run, check_unique_folders
from noisydml.schema import PER_NOISE, ParamsError, check_choice
from noisydml.studies import all_runs, check_studies


def check_all(params: dict[str, Any]) -> dict[str, Any]:
    """Validate every registry- and study-owned section of already-loaded params (registries' defaults filled in;
    the studies' sections validated where used, :func:`noisydml.studies.check_study`); return them."""
    known = method_names()
    for name in params["methods"]:
        check_choice(name, known, "methods", "method")
    for i, m in enumerate(params["report"]["metrics"]):
        check_choice(m, metric_names(params["evaluate"]["recall_at"]), f"report.metrics[{i}]", "metric")
    for name in params["datasets"]:
        check_dataset(params, name)
    for name in params["noise"]:
        check_noise(params, name)
    for name in list(params["methods"]):
        for noise in check_method(params, name).get(PER_NOISE, {}):
            check_choice(noise, list(params["noise"]), f"methods.{name}.{PER_NOISE}", "noise setting")
    check_backbone(params["train"], params["weights"])
    for name in params["grid"]["methods"]:
        check_frozen_backbone(params["methods"][name], params["train"], f"methods.{name}")
    # a chain's and a timing entry's params as they train (Run.params: the one merge of overrides), checked as
    # every job's are (pipeline/job.py)
    for entry in params["timing"]["entries"]:
        run = timing_run(params, entry)
        check_run_params(run.params(params), run.method, f"timing.entries.{entry}.hparams")
    for key, chain in params["chains"].items():
        check_run_params(chain_run(key, chain, 0).params(params), chain["method"], f"chains.{key}.hparams")
    train = params["train"]
    batch = train["batch"]
    for ds_name in params["grid"]["datasets"]:
        ds = params["datasets"][ds_name]
        n_train = DATASET_KINDS[ds["kind"]].train_classes(ds)
        if n_train is not None and batch["classes"] > n_train:
            raise ParamsError(
                f"train.batch.classes: {batch['classes']} classes per batch, but dataset {ds_name!r} "
                f"has only {n_train} training classes; allowed: 2..{n_train}"
            )
        if n_train is not None and train["validation_classes"] and n_train - train["validation_classes"] < batch["classes"]:
            raise ParamsError(
                f"train.validation_classes: {train['validation_classes']} held out of dataset {ds_name!r}'s "
                f"{n_train} training classes leaves fewer than train.batch.classes ({batch['classes']}) to train on"
            )
    check_studies(params)  # every study's sections
    check_unique_folders(all_runs(params))  # no two runs of any kind (grid, chains, tuned, studies') share a folder
    return params


def validate_all(raw: Any) -> dict[str, Any]:
    """:func:`noisydml.config.validate_params` + :func:`check_all` of a raw params mapping."""
    return check_all(validate_params(raw))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m noisydml.pipeline.check", description=__doc__.splitlines()[0])
    parser.add_argument("params", nargs="?", default="params.yaml", help="the params file (default: params.yaml)")
    path = parser.parse_args(argv).params
    try:
        check_all(load_params(path))
    except ParamsError as e:
        message = str(e)  # reading and the global checks name the file already; the registries' checks do not
        print(f"error: {message if message.startswith(f'{path}:') else f'{path}: {message}'}", file=sys.stderr)
        return 2
    print(f"{path}: valid")
    return 0


if __name__ == "__main__":
    sys.exit(main())
