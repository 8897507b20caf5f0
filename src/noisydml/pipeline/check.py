"""Validate all of params.yaml at once: ``noisydml check [params.yaml]``.

Each stage validates the sections it loads (:func:`noisydml.config.load_params`) and the registry entries it uses;
this checks every section, every dataset, noise setting and method entry, the backbone and the rules that span
sections (every method a module of the catalog, report metrics the evaluate stage computes, no two runs of any
kind in one folder, every study's sections), so a mistake in a section no stage of the grid uses yet is found too.
The launcher runs it before any stage, CI and the tests on the repository's params.yaml. No stage imports this
module: editing a rule here re-runs nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import Any

from noisydml.config import read_params_file, validate_sections
from noisydml.data import DatasetError
from noisydml.data.registry import DATASET_KINDS, check_dataset
from noisydml.evaluation import metric_names
from noisydml.methods import check_frozen_backbone, check_method, method_names
from noisydml.models import check_backbone
from noisydml.noise import check_noise
from noisydml.pipeline.job import check_run_params
from noisydml.pipeline.timing import timing_run
from noisydml.runs import chain_run, check_unique_folders
from noisydml.schema import PER_NOISE, ErrorCollector, ParamsError, ParamsErrors, check_choice
from noisydml.studies import all_runs, check_studies


def check_all(params: dict[str, Any], errors: ErrorCollector | None = None, files: Path | None = None) -> dict[str, Any]:
    """Validate every registry- and study-owned section of already-loaded params (registries' defaults filled in;
    the studies' sections validated where used, :func:`noisydml.studies.check_study`); return them.

    Every problem is found in one pass and raised together (:class:`noisydml.schema.ParamsErrors`), with those
    already in ``errors`` (the sections that failed to load); a check that reads a section that failed is skipped
    (that section's problem is the one to fix). ``files``: the repository root that relative paths in params.yaml
    start from (where the stages run): the grid's folder datasets' files are checked there (``noisydml check``
    and the launcher pass it; None: not checked)."""
    errors = errors if errors is not None else ErrorCollector()

    def check(*sections: str):
        """The collector's ``check()`` when every section named is loaded, else a context that skips its block."""
        if all(name in params for name in sections):
            return errors.check()
        return _Skip()

    known = method_names()
    for name in params.get("methods", {}):
        with check("methods"):
            check_choice(name, known, "methods", "method")
    for i, m in enumerate(params.get("report", {}).get("metrics", [])):
        with check("report", "evaluate"):
            check_choice(m, metric_names(params["evaluate"]["recall_at"]), f"report.metrics[{i}]", "metric")
    for name in params.get("datasets", {}):
        with check("datasets"):
            check_dataset(params, name)
    # the grid's folder datasets (every one defined when the grid itself failed to load)
    for name in (params["grid"]["datasets"] if "grid" in params else params.get("datasets", {})) if files else []:
        with check("datasets"):
            if params["datasets"].get(name, {}).get("kind") == "folder":
                check_folder_files(params["datasets"][name], f"datasets.{name}", files)
    for name in params.get("noise", {}):
        with check("noise"):
            check_noise(params, name)
    for name in list(params.get("methods", {})):
        with check("methods", "noise"):
            if name in known:
                for noise in check_method(params, name).get(PER_NOISE, {}):
                    check_choice(noise, list(params["noise"]), f"methods.{name}.{PER_NOISE}", "noise setting")
    with check("train", "weights"):
        check_backbone(params["train"], params["weights"])
    for name in params.get("grid", {}).get("methods", []):
        with check("methods", "train"):
            if name in params["methods"]:
                check_frozen_backbone(params["methods"][name], params["train"], f"methods.{name}")
    errors.raise_if_any()  # what follows builds runs from the sections above: they must be whole
    # a chain's and a timing entry's params as they train (Run.params: the one merge of overrides), checked as
    # every job's are (pipeline/job.py)
    for entry in params["timing"]["entries"]:
        with check("timing"):
            run = timing_run(params, entry)
            check_run_params(run.params(params), run.method, f"timing.entries.{entry}.hparams")
    for key, chain in params["chains"].items():
        with check("chains"):
            check_run_params(chain_run(key, chain, 0).params(params), chain["method"], f"chains.{key}.hparams")
    train = params["train"]
    batch = train["batch"]
    for ds_name in params["grid"]["datasets"]:
        ds = params["datasets"][ds_name]
        with check("datasets"):
            n_train = DATASET_KINDS[ds["kind"]].train_classes(ds)
            if n_train is not None and batch["classes"] > n_train:
                raise ParamsError(
                    f"train.batch.classes: {batch['classes']} classes per batch, but dataset {ds_name!r} "
                    f"has only {n_train} training classes; allowed: 2..{n_train}"
                )
            if n_train is not None and train["validation_classes"] and \
                    n_train - train["validation_classes"] < batch["classes"]:
                raise ParamsError(
                    f"train.validation_classes: {train['validation_classes']} held out of dataset {ds_name!r}'s "
                    f"{n_train} training classes leaves fewer than train.batch.classes ({batch['classes']}) to train on"
                )
    with check():
        check_studies(params)  # every study's sections
    if not errors.messages:
        check_unique_folders(all_runs(params))  # no two runs of any kind (grid, chains, tuned, studies') share a folder
    errors.raise_if_any()
    return params


def check_folder_files(cfg: dict, where: str, base: Path = Path(".")) -> None:
    """A ``folder`` dataset of the grid: its root (or CSV) exists and lists enough classes and images, its CSV has
    the columns it needs (noisydml.data.folder.list_items; no image is decoded: the prepare stage does that)."""
    from noisydml.data.folder import list_items

    key = "root" if cfg.get("root") else "csv"
    if not cfg[key]:
        return  # neither given: the kind's own check says so
    path = base / cfg[key]
    if not path.exists():
        raise ParamsError(f"{where}.{key}: {cfg[key]!r} does not exist (from {base.resolve()}); allowed: "
                          + ("a folder with one sub-folder per class" if key == "root" else "a CSV of path,label"))
    if key == "root" and not path.is_dir():
        raise ParamsError(f"{where}.root: {cfg[key]!r} is not a folder; allowed: a folder with one sub-folder per class")
    try:
        items = list_items(cfg, base)[0]
    except (DatasetError, OSError, ValueError, KeyError) as e:
        raise ParamsError(f"{where}.{key}: {cfg[key]!r}: {e}") from None
    missing = [item[0] for item in items if not Path(item[0]).is_file()]
    if missing:
        raise ParamsError(f"{where}.csv: {cfg[key]!r} lists {len(missing)} image(s) that do not exist, e.g. "
                          f"{missing[0]}; allowed: paths relative to the CSV's folder, or absolute")


class _Skip(contextlib.AbstractContextManager):
    """A check's context when a section it reads failed to load: its block's error is not reported (KeyError,
    TypeError of the missing section) -- the section's own is."""

    def __exit__(self, kind, value, traceback):
        return kind is not None and issubclass(kind, (KeyError, TypeError, ParamsError))


def validate_all(raw: Any, files: Path | None = None) -> dict[str, Any]:
    """:func:`noisydml.config.validate_params` + :func:`check_all` of a raw params mapping, every problem at once
    (``files``: :func:`check_all`'s)."""
    params, errors = validate_sections(raw)
    return check_all(params, errors, files)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="noisydml check", description=__doc__.splitlines()[0])
    parser.add_argument("params", nargs="?", default="params.yaml", help="the params file (default: params.yaml)")
    path = parser.parse_args(argv).params
    try:
        validate_all(read_params_file(path), files=Path(path).resolve().parent)
    except ParamsErrors as e:
        print(f"error: {e.text(f'{path}: ')}", file=sys.stderr)
        return 2
    except ParamsError as e:  # the file itself (reading names it already)
        message = str(e)
        print(f"error: {message if message.startswith(f'{path}:') else f'{path}: {message}'}", file=sys.stderr)
        return 2
    print(f"{path}: valid")
    return 0


if __name__ == "__main__":
    sys.exit(main())
