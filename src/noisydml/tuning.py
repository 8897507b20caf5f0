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

A chained run (``chains``) is tuned by name: ``tuning.chains`` lists chain names, each studied at every (dataset,
noise) of ``tuning.datasets x tuning.noises`` (stage ``tune_chain@<dataset>-<noise>-<name>``), where ``chains`` must
have one entry of that name. Its space is its method's (``tuning.spaces.<method>``); a study first trains the
chain's upstream runs (its :func:`lineage`, untuned) on the same split of the training classes, then scores each
trial of the chain's own step on them; the tuned run ``<name>_tuned`` (stage
``train_tuned_chain@<dataset>-<noise>-<name>``) is the chain trained from the grid's upstream with the chosen values.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any, Mapping

from noisydml.schema import Field, ParamsError, check_choice, check_section, check_unique, mapping_or_empty

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
    "chains": Field(list, item_type=str, help="chained runs tuned, by name (chains.<key>.name, at every dataset x noise "
                                              "tuned; the space is its method's); [] = none"),
    "trials": Field(int, min=1, help="trials per study: the same budget for every method"),
    "validation_classes": Field(int, min=2, help="training classes held out (by noisy label) to score a trial"),
    "seed": Field(int, min=0, help="the seed of every trial's training and of the sampler"),
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


def check_tuning(section: Any, p: dict[str, Any]) -> dict[str, Any]:
    """params.yaml's ``tuning`` (``p``: params validated so far, ``grid``, ``methods`` and ``chains`` included)."""
    t = check_section(section, TUNING_SCHEMA, "tuning")
    t["sampler"] = check_section(t["sampler"], SAMPLER_SCHEMA, "tuning.sampler")
    tuned = t["methods"] or t["chains"]
    # where to tune is checked only when something is tuned: a grid without sc50 keeps tuning.noises as written
    for key, allowed, what in (("datasets", p["grid"]["datasets"], "dataset of grid.datasets"),
                               ("noises", p["grid"]["noises"], "noise setting of grid.noises (its labels are made)"),
                               ("methods", list(p["methods"]), "method of methods")):
        check_unique(t[key], f"tuning.{key}")
        for i, name in enumerate(t[key] if tuned else []):
            check_choice(name, allowed, f"tuning.{key}[{i}]", what)
    check_unique(t["chains"], "tuning.chains")
    spaces = mapping_or_empty(t["spaces"], "tuning.spaces", "method -> search space")
    for name in spaces:
        check_choice(name, list(p["methods"]), "tuning.spaces", "method of methods")
    t["spaces"] = {name: _check_space(name, body, p) for name, body in spaces.items()}
    if tuned and not (t["datasets"] and t["noises"]):
        raise ParamsError("tuning: methods or chains are listed but tuning.datasets or tuning.noises is []; allowed: "
                          "at least one dataset and one noise setting to tune on")
    for i, name in enumerate(t["methods"]):
        if name not in t["spaces"]:
            raise ParamsError(f"tuning.methods[{i}]: {name!r} has no search space; allowed: a method of "
                              f"tuning.spaces ({', '.join(t['spaces']) or 'none'}), or add tuning.spaces.{name}")
        _check_untuned_inside(t["spaces"][name], untuned_values(p, name, t["spaces"][name]), name, "params.yaml's")
    searched = set(t["methods"])  # the spaces a study searches: the tuned methods' and the tuned chains' methods'
    for i, name in enumerate(t["chains"]):
        for dataset in t["datasets"]:
            for noise in t["noises"]:
                key, chain = find_chain(p["chains"], dataset, noise, name, f"tuning.chains[{i}]")
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


def with_overrides(params: Mapping[str, Any], method: str, hparams: Mapping[str, Any],
                   train: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` as one run trains with them: ``hparams`` over ``methods.<method>`` (a nested section is merged
    key by key) and ``train`` over ``train`` (a run's own overrides: a chain's, a study's point)."""
    section = dict(params["methods"][method])
    for key, value in hparams.items():
        nested = isinstance(value, Mapping) and isinstance(section.get(key), Mapping)
        section[key] = {**section[key], **value} if nested else value
    return {**params, "train": {**params["train"], **train}, "methods": {**params["methods"], method: section}}


def chain_params(params: Mapping[str, Any], chain: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` as a chained run (an entry of ``chains``) trains with them."""
    return with_overrides(params, chain["method"], chain["hparams"], chain["train"])


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


def study_name(dataset: str, noise: str, method: str) -> str:
    """``<dataset>-<noise>-<method>``: the tune stage's matrix key (``tune@<study_name>``)."""
    return f"{dataset}-{noise}-{method}"


def study_folder(dataset: str, noise: str, method: str) -> str:
    """The tune stage's output, relative to the repository root."""
    return f"{TUNING_ROOT}/{dataset}/{noise}/{method}"


def studies_of(params: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """Every (dataset, noise, method) tuning study, in the tune stage's matrix order."""
    t = params["tuning"]
    return [(d, n, m) for d in t["datasets"] for n in t["noises"] for m in t["methods"]]


def chain_studies_of(params: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """Every (dataset, noise, chain name) tuning study, in the tune_chain stage's matrix order."""
    t = params["tuning"]
    return [(d, n, c) for d in t["datasets"] for n in t["noises"] for c in t["chains"]]
