"""Validate all of params.yaml at once: ``noisydml check [params.yaml]``.

Each stage validates the sections it loads (:func:`noisydml.config.load_params`) and the registry entries it uses;
this checks every section, every dataset, noise setting and method entry, the backbone and the rules that span
sections (every method a module of the catalog, report metrics the evaluate stage computes, no two runs of any
kind in one folder, every study's sections), so a mistake in a section no stage of the grid uses yet is found too.
The launcher runs it before any stage, CI and the tests on the repository's params.yaml. No stage imports this
module: editing a rule here re-runs nothing.
"""

from __future__ import annotations

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
from noisydml.schema import PER_NOISE, ErrorCollector, ParamsError, ParamsErrors, check_choice, did_you_mean
from noisydml.studies import all_runs, check_studies, section_owners


def check_all(params: dict[str, Any], errors: ErrorCollector | None = None, files: Path | None = None,
              raw: dict[str, Any] | None = None) -> dict[str, Any]:
    """Validate every registry- and study-owned section of already-loaded params (registries' defaults filled in;
    the studies' sections validated where used, :func:`noisydml.studies.check_study`); return them.

    Every problem is found in one pass and raised together (:class:`noisydml.schema.ParamsErrors`), with those
    already in ``errors`` (the sections that failed to load); a check that reads a section that failed is skipped
    (that section's problem is the one to fix). ``files``: the repository root that relative paths in params.yaml
    start from (where the stages run): the grid's folder datasets' files are checked there (``noisydml check``
    and the launcher pass it; None: not checked). ``raw``: the file as written; the rules that name one key of a
    section that failed to validate for another key (the backbone, the report's run names) read it there, so
    that a mistake elsewhere in that section hides none."""
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
    seen = _WrittenOrValid(params, raw or {})
    for i, m in enumerate(params.get("report", {}).get("metrics", [])):
        with check("report") if "evaluate" in params else _lenient(errors):
            check_choice(m, metric_names(seen["evaluate"]["recall_at"]), f"report.metrics[{i}]", "metric")
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
    with _Skip() if "weights" not in params else _lenient(errors):
        check_backbone(seen["train"], params["weights"])
    for name in params.get("grid", {}).get("methods", []):
        with check("methods", "train"):
            if name in params["methods"]:
                check_frozen_backbone(params["methods"][name], params["train"], f"methods.{name}")
    for key, chain in params.get("chains", {}).items():
        with check("chains", "methods"):
            check_chain_exports(params, key, chain)
    with check("figures"):  # here too, not only in check_studies below: a mistake elsewhere hides none
        owners = section_owners()
        for section in params["figures"]:
            check_choice(section, list(owners), "figures", "section", " (each owned by a study)")
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


def check_chain_exports(params: dict[str, Any], key: str, chain: dict[str, Any]) -> None:
    """What a chained run takes from its upstream (``labels.label``, ``labels.keep``, ``inputs``) must be arrays
    the upstream's method exports (its spec's ``exports``; a chained upstream: its own method's)."""
    from noisydml.methods import load_spec

    chains = params["chains"]
    upstream = next((c for c in chains.values() if c["name"] == chain["upstream"]
                     and (c["dataset"], c["noise"]) == (chain["dataset"], chain["noise"])), None)
    method = upstream["method"] if upstream is not None else chain["upstream"]
    if method not in params["methods"]:
        return  # the upstream's own check says so
    exports = load_spec(method).exports
    wanted = [(f"labels.{k}", chain["labels"][k]) for k in ("label", "keep") if chain["labels"][k]]
    wanted += [(f"inputs[{i}]", name) for i, name in enumerate(chain["inputs"])]
    errors = ErrorCollector()
    for where, name in wanted:
        with errors.check():
            check_choice(name, list(exports), f"chains.{key}.{where}", "export",
                         f" (what {chain['upstream']!r}, method {method}, exports)" if exports else
                         f" ({chain['upstream']!r}, method {method}, exports nothing: take init only)")
    errors.raise_if_any()


def report_name_warnings(params: dict[str, Any]) -> list[str]:
    """``report.labels``, ``report.panels`` and ``report.reference_rows`` name runs: a method of the catalog or of
    ``methods``, a chained run's name, or either's tuned run (``<name>_tuned``). A name that is none of these in
    this configuration labels or draws nothing; it is not refused (a label may be kept for a run that a profile or
    another configuration defines, e.g. a chain dropped here) but said, with a near miss where there is one: a
    typo is the usual cause. ``noisydml check`` and the launcher print these."""
    from noisydml.runs import TUNED_SUFFIX

    names = [*dict.fromkeys([*method_names(), *params["methods"], *(c["name"] for c in params["chains"].values())])]
    report = params["report"]
    warnings = []

    def check_run(name: Any, where: str) -> None:
        base = name[: -len(TUNED_SUFFIX)] if isinstance(name, str) and name.endswith(TUNED_SUFFIX) else name
        if base not in names:
            warnings.append(f"{where}: {name!r} names no run of this configuration{did_you_mean(name, names)} "
                            "(runs: the methods, the chained runs' names, either + '_tuned'); it labels or draws "
                            "nothing here")

    for section in ("labels", "reference_rows"):
        for name in report[section]:
            check_run(name, f"report.{section}")
    for panel, members in report["panels"].items():
        for i, name in enumerate(members):
            check_run(name, f"report.panels.{panel}[{i}]")
    return warnings


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


@contextlib.contextmanager
def _lenient(errors: ErrorCollector):
    """Collect a rule's refusal; skip it where the section as written lacks a key or has another type (that
    section's own problem is listed)."""
    with _Skip(), errors.check():
        yield


class _WrittenOrValid:
    """A section validated, else as written (for a rule that reads a key the failure was not about)."""

    def __init__(self, params: dict[str, Any], raw: dict[str, Any]):
        self.params, self.raw = params, raw

    def __getitem__(self, section: str) -> Any:
        return self.params[section] if section in self.params else self.raw[section]


class _Skip(contextlib.AbstractContextManager):
    """A check's context when a section it reads failed to load: its block's error is not reported (KeyError,
    TypeError of the missing section) -- the section's own is."""

    def __exit__(self, kind, value, traceback):
        return kind is not None and issubclass(kind, (KeyError, TypeError, ParamsError))


def validate_all(raw: Any, files: Path | None = None) -> dict[str, Any]:
    """:func:`noisydml.config.validate_params` + :func:`check_all` of a raw params mapping, every problem at once
    (``files``: :func:`check_all`'s)."""
    params, errors = validate_sections(raw)
    return check_all(params, errors, files, raw)


def main(argv: list[str] | None = None) -> int:
    from noisydml.tools.console import check_parser

    path = check_parser().parse_args(argv).params
    try:
        params = validate_all(read_params_file(path), files=Path(path).resolve().parent)
    except ParamsErrors as e:
        print(f"error: {e.text(f'{path}: ')}", file=sys.stderr)
        return 2
    except ParamsError as e:  # the file itself (reading names it already)
        message = str(e)
        print(f"error: {message if message.startswith(f'{path}:') else f'{path}: {message}'}", file=sys.stderr)
        return 2
    for warning in report_name_warnings(params):
        print(f"warning: {path}: {warning}", file=sys.stderr)
    print(f"{path}: valid")
    return 0


if __name__ == "__main__":
    sys.exit(main())
