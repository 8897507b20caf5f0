"""Tuning with the same budget for every method: params.yaml's ``tuning`` section, its search spaces and the runs it
adds. Light (no torch, no Optuna): the config core validates the section, :mod:`noisydml.runs` adds the tuned runs.

The protocol (Musgrave et al., "A Metric Learning Reality Check", ECCV 2020: every method gets the same budget on
validation data, never the test set):

- one study per (dataset, noise, method) of ``tuning.datasets x tuning.noises x tuning.methods``, the DVC stage
  ``tune@<dataset>-<noise>-<method>`` (:mod:`noisydml.pipeline.tune`);
- ``tuning.trials`` trials for every method (the same budget), searched by Optuna's sampler over the method's
  space ``tuning.spaces.<method>``; the first trial is the paper's values (``paper:`` of each key; where a key
  gives none, the value params.yaml trains the untuned run with), the second, when it differs, the untuned run's
  values, so the untuned setting is always a candidate;
- a trial trains the method on ``dataset/noise``'s noisy training labels with ``tuning.validation_classes``
  training classes held out (by noisy label: all a practitioner has) and scores the last epoch's P@1 on them;
  the test split is never read;
- the chosen values (the trial with the highest validation P@1) are the stage's output ``chosen.json``, which the
  tuned runs ``<method>_tuned`` (stage ``train_tuned@<dataset>-<noise>-<method>-<seed>``, every seed of
  ``grid.seeds``, on the full training set) depend on: ``dvc dag`` shows tune -> train.
"""

from __future__ import annotations

import copy
from typing import Any, Mapping

from noisydml.schema import Field, ParamsError, _check_value, check_choice, check_section, check_unique, mapping_or_empty

#: A tuned run's name: its method's, with this suffix (its folder runs/<dataset>/<noise>/<method>_tuned/seed<k>).
TUNED_SUFFIX = "_tuned"
#: The tune stage's output folder, per study: ``tuning/<dataset>/<noise>/<method>/``.
TUNING_ROOT = "tuning"
#: The file of that folder the tuned runs read (and depend on): ``{"values": {key: value}}``.
CHOSEN_FILE = "chosen.json"

TUNING_SCHEMA = {
    "datasets": Field(list, item_type=str, help="datasets tuned on (of grid.datasets)"),
    "noises": Field(list, item_type=str, help="noise settings tuned on (of grid.noises)"),
    "methods": Field(list, item_type=str, help="methods tuned (each needs tuning.spaces.<method>); [] = no tuning"),
    "trials": Field(int, min=1, help="trials per study: the same budget for every method"),
    "validation_classes": Field(int, min=2, help="training classes held out (by noisy label) to score a trial"),
    "seed": Field(int, min=0, help="the seed of every trial's training and of the sampler"),
    "sampler": Field(dict, help="Optuna's sampler: {name: tpe | random, startup_trials}"),
    "spaces": Field(dict, help="method -> {key: {low, high, log, paper} | {choices, paper}}"),
}
SAMPLER_SCHEMA = {
    "name": Field(str, choices=("tpe", "random"), help="optuna.samplers.TPESampler or RandomSampler"),
    "startup_trials": Field(int, min=0, help="TPE: trials drawn at random before the model of good trials is used "
                                            "(counts the enqueued first trials)"),
}
RANGE_SCHEMA = {
    "low": Field((int, float)),
    "high": Field((int, float)),
    "log": Field(bool, False, help="sampled on a log scale"),
    "paper": Field((int, float, type(None)), None, help="the paper's value (the first trial); null: the paper "
                                                         "gives none, params.yaml's value is used (ours)"),
}
CHOICES_SCHEMA = {
    "choices": Field(list),
    "paper": Field((int, float, str, bool, type(None)), None, help="the paper's value (the first trial)"),
}


def split_key(method: str, key: str) -> tuple[str, ...]:
    """A space key as a path in params: ``train.<...>`` in train, anything else in ``methods.<method>``."""
    parts = tuple(key.split("."))
    return parts if parts[0] == "train" else ("methods", method, *parts)


def value_at(params: Mapping[str, Any], path: tuple[str, ...], where: str) -> Any:
    """The value at ``path`` of params; a ParamsError naming ``where`` when there is none."""
    node: Any = params
    for i, part in enumerate(path):
        if not isinstance(node, Mapping) or part not in node:
            raise ParamsError(f"{where}: {'.'.join(path)} is not a key of params.yaml (no {part!r} in "
                              f"{'.'.join(path[:i]) or 'the top level'}); a space key is train.<key> or a key of "
                              f"methods.<method>, e.g. train.optimizer.lr or loss.alpha")
        node = node[part]
    return node


def assign(params: Mapping[str, Any], method: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``params`` with ``values`` (space key -> value) set at their paths."""
    out = copy.deepcopy(dict(params))
    for key, value in values.items():
        *head, last = split_key(method, key)
        node = out
        for part in head:
            node = node[part]
        node[last] = value
    return out


def _check_space(method: str, body: Any, p: dict[str, Any], tuned: bool) -> dict[str, dict]:
    """``tuning.spaces.<method>``; ``tuned`` (the method is in tuning.methods): params.yaml's value of every key
    must lie in the space too (the untuned run's values are a trial)."""
    where = f"tuning.spaces.{method}"
    keys = mapping_or_empty(body, where, "key -> range or choices")
    if not keys:
        raise ParamsError(f"{where}: empty; allowed: at least one key, e.g. train.optimizer.lr: "
                          "{low: 1.0e-4, high: 1.0e-3, log: true}")
    space = {}
    for key, entry in keys.items():
        at = f"{where}.{key}"
        current = value_at(p, split_key(method, key), at)
        if isinstance(entry, Mapping) and "choices" in entry:
            e = check_section(entry, CHOICES_SCHEMA, at)
            if not e["choices"]:
                raise ParamsError(f"{at}.choices: [] offers nothing; allowed: a non-empty list")
            candidates = e["choices"]
            inside = lambda v: v in candidates  # noqa: E731
            allowed = f"one of {candidates}"
        else:
            e = check_section(entry, RANGE_SCHEMA, at)
            if not e["low"] < e["high"]:
                raise ParamsError(f"{at}: low {e['low']} is not below high {e['high']}")
            if e["log"] and e["low"] <= 0:
                raise ParamsError(f"{at}.low: {e['low']} on a log scale; allowed: a positive number")
            integer = isinstance(e["low"], int) and isinstance(e["high"], int)
            e["integer"] = integer
            inside = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and e["low"] <= v <= e["high"] \
                and (not integer or isinstance(v, int))  # noqa: E731
            allowed = f"{'an integer' if integer else 'a number'} in [{e['low']}, {e['high']}]"
        if e["paper"] is not None and not inside(e["paper"]):
            raise ParamsError(f"{at}.paper: {e['paper']!r} is outside the space; allowed: {allowed}")
        if tuned and not inside(current):
            raise ParamsError(f"{at}: params.yaml's value {'.'.join(split_key(method, key))} = {current!r} (the "
                              f"untuned run's, always a trial) is outside the space; allowed: {allowed}")
        space[key] = e
    return space


def check_tuning(section: Any, p: dict[str, Any]) -> dict[str, Any]:
    """params.yaml's ``tuning`` (``p``: params validated so far, ``grid`` and ``methods`` included)."""
    t = check_section(section, TUNING_SCHEMA, "tuning")
    t["sampler"] = check_section(t["sampler"], SAMPLER_SCHEMA, "tuning.sampler")
    # where to tune is checked only when something is tuned: a grid without sc50 keeps tuning.noises as written
    for key, allowed, what in (("datasets", p["grid"]["datasets"], "dataset of grid.datasets"),
                               ("noises", p["grid"]["noises"], "noise setting of grid.noises (its labels are made)"),
                               ("methods", list(p["methods"]), "method of methods")):
        check_unique(t[key], f"tuning.{key}")
        for i, name in enumerate(t[key] if t["methods"] else []):
            check_choice(name, allowed, f"tuning.{key}[{i}]", what)
    spaces = mapping_or_empty(t["spaces"], "tuning.spaces", "method -> search space")
    for name in spaces:
        check_choice(name, list(p["methods"]), "tuning.spaces", "method of methods")
    t["spaces"] = {name: _check_space(name, body, p, name in t["methods"]) for name, body in spaces.items()}
    for i, name in enumerate(t["methods"]):
        if name not in t["spaces"]:
            raise ParamsError(f"tuning.methods[{i}]: {name!r} has no search space; allowed: a method of "
                              f"tuning.spaces ({', '.join(t['spaces']) or 'none'}), or add tuning.spaces.{name}")
    if t["methods"] and not (t["datasets"] and t["noises"]):
        raise ParamsError("tuning: methods are listed but tuning.datasets or tuning.noises is []; allowed: at least "
                          "one dataset and one noise setting to tune on")
    _check_value(t["validation_classes"], Field(int, min=2), "tuning.validation_classes")
    return t


def first_trials(params: Mapping[str, Any], method: str, space: Mapping[str, dict]) -> list[dict[str, Any]]:
    """The trials every study starts with: the paper's values (params.yaml's where the paper gives none), then
    params.yaml's values (the untuned run) when they differ."""
    untuned = {key: value_at(params, split_key(method, key), key) for key in space}
    paper = {key: untuned[key] if e["paper"] is None else e["paper"] for key, e in space.items()}
    return [paper] if paper == untuned else [paper, untuned]


def study_name(dataset: str, noise: str, method: str) -> str:
    """``<dataset>-<noise>-<method>``: the tune stage's matrix key (``tune@<study_name>``)."""
    return f"{dataset}-{noise}-{method}"


def study_folder(dataset: str, noise: str, method: str) -> str:
    """The tune stage's output, relative to the repository root."""
    return f"{TUNING_ROOT}/{dataset}/{noise}/{method}"


def studies_of(params: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """Every (dataset, noise, method) tuning studies, in the tune stage's matrix order."""
    t = params["tuning"]
    return [(d, n, m) for d in t["datasets"] for n in t["noises"] for m in t["methods"]]
