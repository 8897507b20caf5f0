"""The JSON Schema of params.yaml, from the same declarations the loader validates with (pydantic models of
:mod:`noisydml.schema`), for an editor: ``params.schema.json``, which params.yaml names on its first line
(``# yaml-language-server: $schema=params.schema.json``: VS Code's YAML extension, and any editor using the YAML
language server, then completes keys, shows each key's help and marks a wrong type or value as you type).

``python -m noisydml.tools.params_schema`` writes it (a generated file, not committed: it follows the methods,
kinds and studies present); a test checks params.yaml against it. What a schema cannot say (checks across keys, such as a chain's upstream being in the
grid) is checked at load time only (``noisydml check``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Mapping

from noisydml.sections import chains, grid, noise_runs, pretrain, timing, tracking, train as train_section, weights
from noisydml.data.registry import DATASET_KINDS
from noisydml.evaluation import EVALUATE_SCHEMA
from noisydml.methods import load_spec, method_names
from noisydml.pipeline import report_params
from noisydml.noise import FEATURES_SCHEMA, NOISE_KINDS
from noisydml.runtime import RUNTIME_SCHEMA
from noisydml.schema import TOP_LEVEL, Field, section_model
from noisydml import tuning
from noisydml.studies import load_study, study_names

SCHEMA_FILE = "params.schema.json"


def _section(schema: Mapping[str, Field], title: str, nested: Mapping[str, dict] | None = None,
             extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A declared section as a JSON Schema object (its nested sections in place of ``type: object``)."""
    out = section_model(schema, False, title).model_json_schema(by_alias=True)
    for key, sub in (nested or {}).items():
        description = out["properties"][key].get("description")
        out["properties"][key] = {**sub, **({"description": description} if description else {})}
    out.update(extra or {})
    return out


def _named(entry: dict[str, Any], description: str) -> dict[str, Any]:
    """A mapping of user-chosen names (letters, digits, '_') to entries."""
    return {"type": "object", "description": description,
            "propertyNames": {"pattern": "^[A-Za-z][A-Za-z0-9_-]*$"}, "additionalProperties": entry}


def _kinded(kinds: Mapping[str, Any], what: str, nested: Mapping[str, Mapping[str, dict]] | None = None) -> dict:
    """One of several kinds, chosen by the entry's ``kind``."""
    options = []
    for kind, spec in kinds.items():
        body = _section(spec.schema, f"{what} kind {kind}", (nested or {}).get(kind))
        body["properties"] = {"kind": {"const": kind, "description": getattr(spec, "description", "") or kind},
                              **body["properties"]}
        body["required"] = ["kind", *body.get("required", [])]
        options.append(body)
    return {"oneOf": options}


def params_json_schema() -> dict[str, Any]:
    """The JSON Schema of params.yaml (draft 2020-12)."""
    train = _section(train_section.TRAIN_SCHEMA, "train", {
        "input": _section(train_section.INPUT_SCHEMA, "train.input"), "batch": _section(train_section.BATCH_SCHEMA, "train.batch"),
        "optimizer": _section(train_section.OPTIMIZER_SCHEMA, "train.optimizer"),
        "schedule": _section(train_section.SCHEDULE_SCHEMA, "train.schedule")})
    methods = {}
    for name in method_names():
        spec = load_spec(name)
        methods[name] = _section(spec.schema, f"methods.{name}",
                                 {key: _section(sub, f"methods.{name}.{key}") for key, sub in (spec.nested or {}).items()},
                                 {"description": spec.description})
    chain_train = {k: train_section.TRAIN_SCHEMA[k] for k in chains.CHAIN_TRAIN_KEYS}
    chain = _section(chains.CHAIN_SCHEMA, "chain", {
        "init": _section(chains.CHAIN_INIT_SCHEMA, "chain.init"),
        "labels": _section(chains.CHAIN_LABELS_SCHEMA, "chain.labels"),
        "train": {**_section({k: Field(f.type, None, min=f.min, max=f.max, above=f.above, choices=f.choices)
                              for k, f in chain_train.items()}, "chain.train"), "required": []}})
    chain["properties"]["seeds"] = {"anyOf": [{"const": "grid"}, {"type": "array", "items": {"type": "integer",
                                                                                             "minimum": 0}}],
                                    "description": chains.CHAIN_SCHEMA["seeds"].help}
    noise_run = _section(noise_runs.NOISE_RUN_SCHEMA, "noise_run", {"run": _section(noise_runs.NOISE_RUN_RUN_SCHEMA,
                                                                                "noise_run.run")})
    studies = {}
    for name in study_names():
        study = load_study(name)
        for key in study.sections:
            studies[key] = {"type": "object", "description": f"{study.title}: validated by the study "
                                                             f"(noisydml/studies/{name}.py) at load time"}
    properties = {
        "grid": _section(grid.GRID_SCHEMA, "grid"),
        "method_sets": _named({"type": "array", "items": {"type": "string"}}, "named lists of methods"),
        "datasets": _named(_kinded(DATASET_KINDS, "dataset"), "dataset name -> its kind and settings"),
        "noise": _named(_kinded(NOISE_KINDS, "noise", {"small_cluster": {
            "features": _section(FEATURES_SCHEMA, "noise.features")}}), "noise setting name -> its kind and settings"),
        "noise_runs": _named(noise_run, "<dataset>-<noise> -> the grid run whose embeddings it clusters"),
        "pretrain": _section(pretrain.PRETRAIN_SCHEMA, "pretrain"),
        "weights": _named(_section(weights.WEIGHTS_SCHEMA, "weights entry"), "published backbone weights"),
        "train": train,
        "runtime": _section(RUNTIME_SCHEMA, "runtime"),
        "methods": {"type": "object", "properties": methods, "additionalProperties": False},
        "chains": _named(chain, "stage key -> chained run"),
        "evaluate": _section(EVALUATE_SCHEMA, "evaluate"),
        "tracking": _section(tracking.TRACKING_SCHEMA, "tracking"),
        "report": _section(report_params.REPORT_SCHEMA, "report"),
        "timing": _section(timing.TIMING_SCHEMA, "timing", {
            "entries": _named(_section(timing.TIMING_ENTRY_SCHEMA, "timing entry"), "label -> timed run")}),
        "tuning": _section(tuning.TUNING_SCHEMA, "tuning", {
            "sampler": _section(tuning.SAMPLER_SCHEMA, "tuning.sampler"),
            "spaces": {"type": "object", "additionalProperties": {
                "type": "object", "description": "key (train.<key> or a key of methods.<method>) -> range or choices",
                "additionalProperties": {"anyOf": [_section(tuning.RANGE_SCHEMA, "tuning range"),
                                                   _section(tuning.CHOICES_SCHEMA, "tuning choices")]}}}}),
        "figures": {"type": "object", "properties": studies, "additionalProperties": False},
        "profiles": {"type": "object", "description": "named lists of `dvc exp run -S` arguments"},
    }
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "noisydml params.yaml",
            "type": "object", "properties": {k: v for k, v in properties.items() if k in TOP_LEVEL},
            "required": [k for k in TOP_LEVEL if k in properties and k != "profiles"],
            "additionalProperties": False}


def write_schema(path: str | Path = SCHEMA_FILE) -> Path:
    path = Path(path)
    path.write_text(json.dumps(params_json_schema(), indent=1, sort_keys=False) + "\n")
    return path


if __name__ == "__main__":
    print(f"wrote {write_schema(*sys.argv[1:2])}")
