"""params.yaml: loading and validation.

params.yaml is the single source of truth of the pipeline. Every stage calls
:func:`load_params` first, so a mistake (unknown method, a rate outside
[0, 1], a batch with more classes than the dataset has, ...) stops the first
stage that runs, before any work, with a message that names the key, the bad
value and what is allowed.

Each registry (dataset kinds, noise kinds, methods) declares the schema of its
own section as a mapping ``key -> Field``; this module only knows the shape of
the file around them.
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

_REQUIRED = object()
#: Names used in DVC stage names: no separators DVC or paths would split on.
_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


class ParamsError(ValueError):
    """A problem in params.yaml; the message names the key and the value."""


@dataclass(frozen=True)
class Field:
    """One key of a params section: its type, default and allowed range."""

    type: type | tuple[type, ...]
    default: Any = _REQUIRED
    min: float | None = None
    max: float | None = None
    choices: Sequence[Any] | None = None
    #: For list fields: the type of every element.
    item_type: type | tuple[type, ...] | None = None
    help: str = ""

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED


def _type_name(t: type | tuple[type, ...]) -> str:
    if isinstance(t, tuple):
        return " or ".join(x.__name__ for x in t)
    return t.__name__


def _check_value(value: Any, field: Field, where: str) -> Any:
    expected = field.type
    # YAML writes 1 for 1.0: accept ints where floats are expected.
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    # bool is an int subclass: a YAML true must not pass where a number is expected.
    if isinstance(value, bool) and bool not in (expected if isinstance(expected, tuple) else (expected,)):
        raise ParamsError(f"{where}: expected {_type_name(expected)}, got {value!r}")
    if not isinstance(value, expected):
        raise ParamsError(
            f"{where}: expected {_type_name(expected)}, got {value!r} ({type(value).__name__})"
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise ParamsError(f"{where}: must be a finite number, got {value!r}")
    if field.choices is not None and value not in field.choices:
        raise ParamsError(
            f"{where}: {value!r} is not allowed; allowed values: {', '.join(map(str, field.choices))}"
        )
    if field.item_type is not None:
        for i, item in enumerate(value):
            _check_value(item, Field(field.item_type, min=field.min, max=field.max), f"{where}[{i}]")
        return value
    if field.min is not None and value < field.min:
        raise ParamsError(f"{where}: {value!r} is below the minimum {field.min}")
    if field.max is not None and value > field.max:
        raise ParamsError(f"{where}: {value!r} is above the maximum {field.max}")
    return value


def check_section(
    section: Any, schema: Mapping[str, Field], where: str, *, allow_extra: bool = False
) -> dict[str, Any]:
    """Validate ``section`` against ``schema`` and return it with defaults filled in."""
    if section is None:
        section = {}
    if not isinstance(section, Mapping):
        raise ParamsError(f"{where}: expected a mapping, got {section!r}")
    unknown = sorted(set(section) - set(schema))
    if unknown and not allow_extra:
        raise ParamsError(
            f"{where}: unknown key {unknown[0]!r}; allowed keys: {', '.join(sorted(schema)) or '(none)'}"
        )
    out: dict[str, Any] = dict(section) if allow_extra else {}
    for key, field in schema.items():
        if key in section:
            out[key] = _check_value(section[key], field, f"{where}.{key}")
        elif field.required:
            raise ParamsError(f"{where}: missing required key {key!r}" + (f" ({field.help})" if field.help else ""))
        else:
            out[key] = copy.deepcopy(field.default)
    return out


def check_name(name: Any, where: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ParamsError(
            f"{where}: {name!r} is not a valid name (letters, digits and '_', starting with a letter); "
            "names become parts of DVC stage names and paths"
        )
    return name


def check_choice(value: Any, allowed: Sequence[str], where: str, what: str) -> str:
    if value not in allowed:
        raise ParamsError(
            f"{where}: unknown {what} {value!r}; allowed: {', '.join(sorted(allowed)) or '(none defined)'}"
        )
    return value


# --------------------------------------------------------------------------
# The shape of params.yaml
# --------------------------------------------------------------------------

TRAIN_SCHEMA: dict[str, Field] = {
    "backbone": Field(str, "small_cnn"),
    "backbone_width": Field(int, 16, min=1, help="channels of the first block of small_cnn"),
    "pretrained": Field(bool, False),
    "embedding_dim": Field(int, 64, min=2),
    "epochs": Field(int, 12, min=1),
    "batch": Field(dict, {"classes": 16, "per_class": 4}),
    "optimizer": Field(dict, {"name": "adam", "lr": 1e-3, "weight_decay": 1e-4}),
    "schedule": Field(dict, {"name": "cosine", "warmup_epochs": 0}),
    "eval_every": Field(int, 1, min=0, help="epochs between test-set monitoring; 0 = final epoch only"),
    "device": Field(str, "auto", choices=("auto", "cpu", "cuda")),
    "threads": Field(int, 0, min=0, help="torch CPU threads; 0 = torch's default"),
    "validation_classes": Field(int, 0, min=0, help="training classes (by noisy label) held out for model selection"),
    "model_selection": Field(str, "last", choices=("last", "best_validation"),
                             help="the reported model: the last epoch's, or the best validation P@1's"),
}
BATCH_SCHEMA = {
    "classes": Field(int, 16, min=2, help="P: classes per batch"),
    "per_class": Field(int, 4, min=2, help="K: samples per class in a batch"),
}
OPTIMIZER_SCHEMA = {
    "name": Field(str, "adam", choices=("adam", "adamw", "sgd")),
    "lr": Field(float, 1e-3, min=0.0),
    "weight_decay": Field(float, 1e-4, min=0.0),
    "momentum": Field(float, 0.9, min=0.0, max=1.0, help="sgd only"),
}
SCHEDULE_SCHEMA = {
    "name": Field(str, "cosine", choices=("cosine", "step", "constant")),
    "warmup_epochs": Field(int, 0, min=0),
    "step_epochs": Field(int, 10, min=1, help="step schedule: epochs between decays"),
    "gamma": Field(float, 0.1, min=0.0, max=1.0, help="step schedule: decay factor"),
}
EVALUATE_SCHEMA = {
    "recall_at": Field(list, [1, 2, 4, 8], item_type=int, min=1),
    "max_k": Field(int, 1023, min=1, help="cap on neighbours retrieved for MAP@R and R-Precision"),
    "nmi": Field(bool, True),
}
GRID_SCHEMA = {
    "datasets": Field(list, item_type=str),
    "noises": Field(list, item_type=str),
    "methods": Field(list, item_type=str),
    "seeds": Field(list, [0], item_type=int, min=0),
}
TOP_LEVEL = ("grid", "method_sets", "datasets", "noise", "train", "evaluate", "methods", "tracking", "report",
             "timing")
TRACKING_SCHEMA = {
    "experiment": Field(str, "noisydml"),
}
TIMING_SCHEMA = {
    "noise": Field(str, help="the noise setting (in grid.noises) whose labels every timed method trains on"),
    "epochs": Field(int, 2, min=1, help="epochs per timed method; the first is not counted when there are more"),
    "entries": Field(list, help="rows of the table: {label, method, hparams (overrides of methods.<method>)}"),
}
TIMING_ENTRY_SCHEMA = {
    "label": Field(str),
    "method": Field(str),
    "hparams": Field(dict, {}),
}
REPORT_SCHEMA = {
    "metrics": Field(list, ["precision_at_1", "mean_average_precision_at_r"], item_type=str),
}


def _unique(values: list, where: str) -> None:
    seen = set()
    for v in values:
        if v in seen:
            raise ParamsError(f"{where}: {v!r} is listed twice")
        seen.add(v)


def _check_kinded_sections(section: Any, key: str, what: str, check_body, kinds: list[str]) -> dict[str, dict]:
    """Validate ``{name: {kind: ..., **kind's keys}}`` sections (datasets, noise settings)."""
    if not isinstance(section, Mapping) or not section:
        raise ParamsError(f"{key}: expected a non-empty mapping of {what} name -> settings")
    out = {}
    for name, body in section.items():
        where = f"{key}.{check_name(name, key)}"
        if not isinstance(body, Mapping) or "kind" not in body:
            raise ParamsError(f"{where}: expected a mapping with a 'kind' key")
        kind = check_choice(body["kind"], kinds, f"{where}.kind", f"{what} kind")
        out[name] = {"kind": kind, **check_body(kind, {k: v for k, v in body.items() if k != "kind"}, where)}
    return out


def _check_timing(section: Any, p: dict[str, Any]) -> dict[str, Any]:
    """The training-time table: methods timed on the same data (PRISM's Table 4 layout)."""
    from noisydml.methods import METHODS

    if section is None:
        section = {"noise": p["grid"]["noises"][0], "entries": [{"label": m, "method": m} for m in p["grid"]["methods"]]}
    timing = check_section(section, TIMING_SCHEMA, "timing")
    check_choice(timing["noise"], p["grid"]["noises"], "timing.noise", "noise setting of grid.noises")
    if not timing["entries"]:
        raise ParamsError("timing.entries: must list at least one method to time")
    entries = []
    for i, raw_entry in enumerate(timing["entries"]):
        where = f"timing.entries[{i}]"
        entry = check_section(raw_entry, TIMING_ENTRY_SCHEMA, where)
        check_choice(entry["method"], list(METHODS), f"{where}.method", "method")
        merged = {**p["methods"][entry["method"]], **entry["hparams"]}
        entry["hparams"] = METHODS[entry["method"]].check(merged, f"{where}.hparams")
        entries.append(entry)
    _unique([e["label"] for e in entries], "timing.entries[].label")
    timing["entries"] = entries
    return timing


def _check_feature_runs(p: dict[str, Any]) -> None:
    """Noise whose features are a run's embeddings: the run must be one the grid trains, on other noise."""
    from noisydml.methods import METHODS

    grid = p["grid"]
    for name, cfg in p["noise"].items():
        feats = cfg.get("features") if isinstance(cfg.get("features"), Mapping) else None
        if not feats or feats.get("source") != "run":
            continue
        where = f"noise.{name}.features"
        source = feats["noise"]
        check_choice(source, list(p["noise"]), f"{where}.noise", "noise setting")
        check_choice(feats["method"], list(METHODS), f"{where}.method", "method")
        if source == name:
            raise ParamsError(f"{where}.noise: {name!r} cannot take features from a run trained on its own labels")
        src_feats = p["noise"][source].get("features")
        if isinstance(src_feats, Mapping) and src_feats.get("source") == "run":
            raise ParamsError(
                f"{where}.noise: {source!r} itself takes features from a run; use a noise setting whose "
                "labels do not depend on another run"
            )
        if name in grid["noises"]:
            missing = [f"{key} {value!r} is not in grid.{key}s" for key, value in
                       (("noise", source), ("method", feats["method"]), ("seed", feats["seed"]))
                       if value not in grid[f"{key}s"]]
            if missing:
                raise ParamsError(
                    f"{where}: the features come from the run {feats['method']}/{source}/seed {feats['seed']}, "
                    f"which the grid does not train ({'; '.join(missing)}); add it to the grid"
                )


def validate_params(raw: Any) -> dict[str, Any]:
    """Validate the whole params mapping; return a copy with every default filled in."""
    # Imported here: the registries import torch, and config must stay importable alone.
    from noisydml.data.registry import DATASET_KINDS
    from noisydml.methods import METHODS
    from noisydml.noise import NOISE_KINDS

    if not isinstance(raw, Mapping):
        raise ParamsError(f"params: expected a mapping at the top level, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(TOP_LEVEL))
    if unknown:
        raise ParamsError(f"params: unknown top-level key {unknown[0]!r}; allowed: {', '.join(TOP_LEVEL)}")
    for key in ("grid", "datasets", "noise"):
        if key not in raw:
            raise ParamsError(f"params: missing required section {key!r}")
    p: dict[str, Any] = {}

    # datasets and noise: name -> {kind, ...that kind's own keys}
    p["datasets"] = _check_kinded_sections(
        raw["datasets"], "datasets", "dataset", lambda kind, body, where: DATASET_KINDS[kind].check(body, where),
        list(DATASET_KINDS),
    )
    p["noise"] = _check_kinded_sections(
        raw["noise"], "noise", "noise", lambda kind, body, where: NOISE_KINDS[kind].check(body, where),
        list(NOISE_KINDS),
    )

    # methods: hyper-parameters per method (missing ones take the method's defaults)
    raw_methods = raw.get("methods") or {}
    if not isinstance(raw_methods, Mapping):
        raise ParamsError("methods: expected a mapping of method name -> hyper-parameters")
    p["methods"] = {}
    for name in raw_methods:
        check_choice(name, list(METHODS), "methods", "method")
    for name, spec in METHODS.items():
        p["methods"][name] = spec.check(raw_methods.get(name), f"methods.{name}")

    # train / evaluate / tracking / report
    train = check_section(raw.get("train"), TRAIN_SCHEMA, "train")
    train["batch"] = check_section(train["batch"], BATCH_SCHEMA, "train.batch")
    train["optimizer"] = check_section(train["optimizer"], OPTIMIZER_SCHEMA, "train.optimizer")
    train["schedule"] = check_section(train["schedule"], SCHEDULE_SCHEMA, "train.schedule")
    from noisydml.models import BACKBONES

    check_choice(train["backbone"], list(BACKBONES), "train.backbone", "backbone")
    if train["schedule"]["warmup_epochs"] >= train["epochs"]:
        raise ParamsError(
            f"train.schedule.warmup_epochs: {train['schedule']['warmup_epochs']} must be below "
            f"train.epochs ({train['epochs']})"
        )
    if train["model_selection"] == "best_validation" and train["validation_classes"] == 0:
        raise ParamsError("train.model_selection: 'best_validation' needs train.validation_classes > 0 "
                          "(held-out training classes; the test set is never used to select a model)")
    p["train"] = train
    p["evaluate"] = check_section(raw.get("evaluate"), EVALUATE_SCHEMA, "evaluate")
    p["tracking"] = check_section(raw.get("tracking"), TRACKING_SCHEMA, "tracking")
    p["report"] = check_section(raw.get("report"), REPORT_SCHEMA, "report")

    # grid: every name must exist in its section
    grid = check_section(raw["grid"], GRID_SCHEMA, "grid")
    for key, section, what in (
        ("datasets", p["datasets"], "dataset"),
        ("noises", p["noise"], "noise setting"),
        ("methods", METHODS, "method"),
    ):
        if not grid[key]:
            raise ParamsError(f"grid.{key}: must list at least one {what}")
        _unique(grid[key], f"grid.{key}")
        for i, name in enumerate(grid[key]):
            check_choice(name, list(section), f"grid.{key}[{i}]", what)
    _unique(grid["seeds"], "grid.seeds")
    p["grid"] = grid
    _check_feature_runs(p)
    p["timing"] = _check_timing(raw.get("timing"), p)

    # method_sets: named lists (params.yaml uses YAML anchors so grid.methods can point at one)
    p["method_sets"] = {}
    for set_name, names in (raw.get("method_sets") or {}).items():
        where = f"method_sets.{set_name}"
        _check_value(names, Field(list, item_type=str), where)
        for i, m in enumerate(names):
            check_choice(m, list(METHODS), f"{where}[{i}]", "method")
        p["method_sets"][set_name] = list(names)

    # cross-section checks that need no data on disk
    batch = train["batch"]
    for ds_name in grid["datasets"]:
        ds = p["datasets"][ds_name]
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
    from noisydml.evaluation.retrieval import metric_names

    for i, m in enumerate(p["report"]["metrics"]):
        check_choice(m, metric_names(p["evaluate"]["recall_at"]), f"report.metrics[{i}]", "metric")
    return p


def load_params(path: str | Path = "params.yaml") -> dict[str, Any]:
    """Read and validate params.yaml (see :func:`validate_params`)."""
    path = Path(path)
    if not path.is_file():
        raise ParamsError(f"{path}: no such file; run from the repository root or pass --params")
    with path.open() as f:
        try:
            raw = yaml.safe_load(f)
        except yaml.YAMLError as e:
            raise ParamsError(f"{path}: not valid YAML: {e}") from e
    try:
        return validate_params(raw)
    except ParamsError as e:
        raise ParamsError(f"{path}: {e}") from None


def run_name(dataset: str, noise: str, method: str, seed: int) -> str:
    """The name of one training run, as DVC's matrix names it (``train@<run_name>``)."""
    return f"{dataset}-{noise}-{method}-{seed}"

