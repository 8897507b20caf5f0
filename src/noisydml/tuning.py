"""Tuning with the same budget for every method: params.yaml's ``tuning`` section and its search spaces. Light (no
torch, no Optuna): this module validates the section (:data:`SECTION_CHECKS`, loaded only by the stages that search
or train with what a search chose); :mod:`noisydml.runs` names the tuned runs it adds (and validates the keys that
name them for the stages that only list them, evaluate and report).

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

A chained run (``chains``) is tuned by name: ``tuning.chains`` lists chain names, each studied at every (dataset,
noise) of ``tuning.datasets x tuning.noises`` (stage ``tune_chain@<dataset>-<noise>-<name>``), where ``chains`` must
have one entry of that name. Its space is its method's (``tuning.spaces.<method>``); a study first trains the
chain's upstream runs (its :func:`noisydml.runs.lineage`, untuned) on the same split of the training classes, then scores each
trial of the chain's own step on them; the tuned run ``<name>_tuned`` (stage
``train_tuned_chain@<dataset>-<noise>-<name>``) is the chain trained from the grid's upstream with the chosen values.
"""

from __future__ import annotations

import copy
import difflib
import itertools
from typing import Any, Mapping

from noisydml.runs import TUNED_RUNS_SCHEMA, chain_params, check_tuned_runs, find_chain, split_key
from noisydml.schema import (
    Field, ParamsError, SectionCheck, check_choice, check_section, check_unique, mapping_or_empty,
)

TUNING_SCHEMA = {
    **TUNED_RUNS_SCHEMA,
    "trials": Field(int, min=1, help="trials per study: the same budget for every method"),
    "validation_classes": Field(int, min=2, help="training classes held out (by noisy label) to score a trial"),
    "seed": Field(int, min=0, help="the seed of the sampler, of the held-out classes and of a chain's upstream runs"),
    "seeds": Field(list, help="every trial trains once per seed listed and is scored by the mean of their validation "
                              "P@1 (ours: [0] = one run per trial); the budget is trials x seeds for every method"),
    "sampler": Field(dict, help="Optuna's sampler: {name: tpe | random, startup_trials}"),
    "spaces": Field(dict, help="method -> {key: {low, high, log, paper} | {choices, paper}}"),
}
SAMPLER_SCHEMA = {
    "name": Field(str, choices=("tpe", "random", "grid"),
                  help="optuna.samplers.TPESampler or RandomSampler; grid: every combination of the space's choices, "
                       "each once, in order (a space of choices only; its size is the budget, not tuning.trials)"),
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


def value_at(params: Mapping[str, Any], path: tuple[str, ...], where: str) -> Any:
    """The value at ``path`` of params; a ParamsError naming ``where`` when there is none."""
    node: Any = params
    for i, part in enumerate(path):
        if not isinstance(node, Mapping) or part not in node:
            near = difflib.get_close_matches(part, list(node), n=1, cutoff=0.75) if isinstance(node, Mapping) else []
            typo = (f"; {'.'.join(path[:i])} has {near[0]!r} instead: if that is a typo of {part!r}, fix it there "
                    f"({'.'.join((*path[:i], near[0]))})") if near else ""
            raise ParamsError(f"{where}: {'.'.join(path)} is not a key of params.yaml (no {part!r} in "
                              f"{'.'.join(path[:i]) or 'the top level'}){typo}; a space key is train.<key> or a key "
                              f"of methods.<method>, e.g. train.optimizer.lr or loss.alpha")
        node = node[part]
    return node


def _inside(entry: dict, value: Any) -> bool:
    """Whether ``value`` lies in one key's space (``entry``: a checked range or choices)."""
    if "choices" in entry:
        return value in entry["choices"]
    return isinstance(value, (int, float)) and not isinstance(value, bool) and entry["low"] <= value <= entry["high"] \
        and (not entry["integer"] or isinstance(value, int))


def _allowed(entry: dict) -> str:
    if "choices" in entry:
        return f"one of {entry['choices']}"
    return f"{'an integer' if entry['integer'] else 'a number'} in [{entry['low']}, {entry['high']}]"


def _check_space(method: str, body: Any, p: dict[str, Any]) -> dict[str, dict]:
    """``tuning.spaces.<method>``: every key a key of params (``train.<key>`` or of ``methods.<method>``) with a
    range or choices that hold its paper value."""
    where = f"tuning.spaces.{method}"
    keys = mapping_or_empty(body, where, "key -> range or choices")
    if not keys:
        raise ParamsError(f"{where}: empty; allowed: at least one key, e.g. train.optimizer.lr: "
                          "{low: 1.0e-4, high: 1.0e-3, log: true}")
    space = {}
    for key, entry in keys.items():
        at = f"{where}.{key}"
        value_at(p, split_key(method, key), at)
        if isinstance(entry, Mapping) and "choices" in entry:
            e = check_section(entry, CHOICES_SCHEMA, at)
            if not e["choices"]:
                raise ParamsError(f"{at}.choices: [] offers nothing; allowed: a non-empty list")
        else:
            e = check_section(entry, RANGE_SCHEMA, at)
            if not e["low"] < e["high"]:
                raise ParamsError(f"{at}: low {e['low']} is not below high {e['high']}")
            if e["log"] and e["low"] <= 0:
                raise ParamsError(f"{at}.low: {e['low']} on a log scale; allowed: a positive number")
            e["integer"] = isinstance(e["low"], int) and isinstance(e["high"], int)
        if e["paper"] is not None and not _inside(e, e["paper"]):
            raise ParamsError(f"{at}.paper: {e['paper']!r} is outside the space; allowed: {_allowed(e)}")
        space[key] = e
    return space


def _check_untuned_inside(space: Mapping[str, dict], untuned: Mapping[str, Any], method: str, whose: str) -> None:
    """The untuned run's values (always a trial) lie in the space; ``whose``: where they come from."""
    for key, entry in space.items():
        value = untuned[key]
        if not _inside(entry, value):
            raise ParamsError(f"tuning.spaces.{method}.{key}: {whose} value {'.'.join(split_key(method, key))} = "
                              f"{value!r} (the untuned run's, always a trial) is outside the space; allowed: "
                              f"{_allowed(entry)}")


def check_tuning(section: Any, p: dict[str, Any], raw: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """params.yaml's ``tuning`` (``p``: params validated so far, ``grid``, ``methods`` and ``chains`` included)."""
    t = {**check_section(section, TUNING_SCHEMA, "tuning"), **check_tuned_runs(section, p, raw or p)}
    t["sampler"] = check_section(t["sampler"], SAMPLER_SCHEMA, "tuning.sampler")
    if not t["seeds"] or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in t["seeds"]):
        raise ParamsError(f"tuning.seeds: {t['seeds']!r}; allowed: a non-empty list of seeds (integers >= 0), e.g. "
                          "[0] or [0, 1, 2]")
    check_unique(t["seeds"], "tuning.seeds")
    spaces = mapping_or_empty(t["spaces"], "tuning.spaces", "method -> search space")
    for name in spaces:
        check_choice(name, list(p["methods"]), "tuning.spaces", "method", " (the entries of the `methods` section)")
    t["spaces"] = {name: _check_space(name, body, p) for name, body in spaces.items()}
    for i, name in enumerate(t["methods"]):
        if name not in t["spaces"]:
            raise ParamsError(f"tuning.methods[{i}]: {name!r} has no search space; allowed: a method of "
                              f"tuning.spaces ({', '.join(t['spaces']) or 'none'}), or add tuning.spaces.{name}")
        _check_untuned_inside(t["spaces"][name], untuned_values(p, name, t["spaces"][name]), name, "params.yaml's")
    searched = set(t["methods"])  # the spaces a study searches: the tuned methods' and the tuned chains' methods'
    for i, name in enumerate(t["chains"]):
        for dataset in t["datasets"]:
            for noise in t["noises"]:
                key, chain = find_chain(p["chains"], dataset, noise, name, f"tuning.chains[{i}]")  # checked: present
                method = chain["method"]
                if method not in t["spaces"]:
                    raise ParamsError(f"tuning.chains[{i}]: {name!r} trains {method!r} (chains.{key}.method), which has "
                                      f"no search space; allowed: add tuning.spaces.{method}")
                _check_untuned_inside(t["spaces"][method], untuned_values(chain_params(p, chain), method,
                                      t["spaces"][method]), method, f"chains.{key}'s")
                searched.add(method)
    if t["sampler"]["name"] == "grid":
        for name in sorted(searched):
            for key, entry in t["spaces"][name].items():
                if "choices" not in entry:
                    raise ParamsError(f"tuning.spaces.{name}.{key}: a range under tuning.sampler.name grid; allowed: "
                                      "{choices: [...]} for every key of a space searched (or sampler tpe / random)")
    return t


def untuned_values(params: Mapping[str, Any], method: str, space: Mapping[str, dict]) -> dict[str, Any]:
    """The values ``params`` (a run's, overrides applied) gives every key of ``space``."""
    return {key: value_at(params, split_key(method, key), key) for key in space}


def first_trials(params: Mapping[str, Any], method: str, space: Mapping[str, dict]) -> list[dict[str, Any]]:
    """The trials every study starts with: the paper's values (``params``' where the paper gives none), then
    ``params``' values (the untuned run's, overrides applied) when they differ."""
    untuned = untuned_values(params, method, space)
    paper = {key: untuned[key] if e["paper"] is None else e["paper"] for key, e in space.items()}
    return [paper] if paper == untuned else [paper, untuned]


def grid_trials(space: Mapping[str, dict]) -> list[dict[str, Any]]:
    """``tuning.sampler.name: grid``: every combination of the choices, the first key varying slowest."""
    return [dict(zip(space, values)) for values in itertools.product(*(e["choices"] for e in space.values()))]


#: The section this module validates (:data:`noisydml.schema.SECTION_OWNERS`).
SECTION_CHECKS = {"tuning": SectionCheck(check_tuning, needs=("grid", "methods", "chains", "train"))}
