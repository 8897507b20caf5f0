"""``chains``: runs trained after, and from, another run of the grid (a DVC edge each)."""

from __future__ import annotations

from typing import Any, Mapping

from noisydml.schema import (
    ErrorCollector, Field, ParamsError, SectionCheck, check_choice, check_name, check_section, did_you_mean, mapping_or_empty,
)
from noisydml.sections.grid import noises_of
from noisydml.sections.train import TRAIN_SCHEMA, check_model_selection


#: A chained run: trained after, and from, another run (its upstream) of the same dataset, noise and seed, for
#: every seed of the grid unless it names its seeds.
CHAIN_SCHEMA = {
    "name": Field(str, help="the run's name: runs/<dataset>/<noise>/<name>/seed<k>, its row in the report"),
    "dataset": Field(str, help="a dataset of grid.datasets"),
    "noise": Field(str, help="a noise setting of grid.noises"),
    "seeds": Field((str, list), help="'grid' (every seed of grid.seeds) or a list of seeds of grid.seeds"),
    "method": Field(str, help="the method this run trains (its hyper-parameters: methods.<method>)"),
    "upstream": Field(str, help="the run it takes from: a method of grid.methods or another chain's name, "
                                "at the same dataset, noise and seed"),
    "init": Field(dict, {"model": False, "method": False},
                  help="start from the upstream's final model / method state (before epoch 0, never on resume)"),
    "labels": Field(dict, {"label": "", "keep": ""},
                    help="train on the upstream's exported labels (label: an export name, '' = the noisy labels) and "
                         "only on the samples whose exported keep value is 1 (keep: an export name, '' = all)"),
    "inputs": Field(list, [], item_type=str, help="upstream exports given to the method (MethodSetup.inputs)"),
    "hparams": Field(dict, {}, help="overrides of methods.<method> for this run only (e.g. a smaller noise_rate)"),
    "train": Field(dict, {}, help="overrides of train for this run only: " + ", ".join(
        ("validation_classes", "model_selection", "epochs"))),
}


CHAIN_INIT_SCHEMA = {"model": Field(bool, False), "method": Field(bool, False)}


CHAIN_LABELS_SCHEMA = {
    "label": Field(str, ""), "keep": Field(str, ""),
    "kind": Field(str, "label_ids", choices=("label_ids", "clusters"),
                  help="what the exported labels are: training-label ids, or cluster ids (e.g. SGPS's c^B); the "
                       "trainer's ground truth then calls a row noisy when its cluster's majority true class is not its own"),
}


#: The train keys a chained run may override (``chains.<key>.train``).
CHAIN_TRAIN_KEYS = ("validation_classes", "model_selection", "epochs")


def _bounds(f: Field) -> dict[str, Any]:
    return {k: getattr(f, k) for k in ("min", "max", "above", "choices") if getattr(f, k, None) is not None}


def _check_chains(section: Any, p: dict[str, Any], raw: Mapping[str, Any]) -> dict[str, dict]:
    """Chained runs (``chains.<key>``): each names its upstream run; the DVC stage ``train_chain@<key>`` depends
    on that run's folder, so ``dvc repro`` trains the upstream first and re-trains the chain when it changes."""
    section = mapping_or_empty(section, "chains", "stage key -> chained run")
    grid = p.get("grid")  # None: grid failed to validate; each chain's own keys are still checked
    chains: dict[str, dict] = {}
    errors = ErrorCollector()  # every chain's problems, not the first chain's
    for key, body in section.items():
        with errors.check():
            chains[key] = _check_chain(key, body, p, raw)
    errors.raise_if_any()
    return _check_chain_graph(chains, grid) if grid is not None else chains


def _check_chain(key: str, body: Any, p: dict[str, Any], raw: Mapping[str, Any]) -> dict[str, Any]:
    """One ``chains.<key>`` entry, its own keys and its dataset, noise, seeds and method."""
    grid = p.get("grid")
    where = f"chains.{check_name(key, 'chains')}"
    c = check_section(body, CHAIN_SCHEMA, where)
    c["init"] = check_section(c["init"], CHAIN_INIT_SCHEMA, f"{where}.init")
    c["labels"] = check_section(c["labels"], CHAIN_LABELS_SCHEMA, f"{where}.labels")
    # a key left out is train's (when train failed to validate, its declared default: train's problem is listed)
    base = p.get("train") or {k: TRAIN_SCHEMA[k].default for k in CHAIN_TRAIN_KEYS}
    c["train"] = check_section(c["train"], {k: Field(TRAIN_SCHEMA[k].type, base[k], **_bounds(TRAIN_SCHEMA[k]))
                                            for k in CHAIN_TRAIN_KEYS}, f"{where}.train")
    if "train" in p:
        check_model_selection({**p["train"], **c["train"]}, f"{where}.train")
    check_name(c["name"], f"{where}.name")
    hint = (" (a chained run needs its upstream in the grid; or drop every chain: -S '~chains' -S '+chains={}', "
            "one: -S '~chains.<key>')")
    check_choice(c["method"], list(raw["methods"]), f"{where}.method", "method")
    if c["name"] in raw["methods"]:
        raise ParamsError(f"{where}.name: {c['name']!r} is a method's name; a chained run needs its own name")
    if not (c["init"]["model"] or c["init"]["method"] or c["labels"]["label"] or c["labels"]["keep"]
            or c["inputs"]):
        raise ParamsError(f"{where}: takes nothing from its upstream {c['upstream']!r}; set init, labels or inputs")
    if grid is None:  # the rules below read the grid, which failed: its problem is listed
        return c
    for field, values in (("dataset", grid["datasets"]), ("noise", noises_of(grid))):
        if c[field] not in values:
            raise ParamsError(f"{where}.{field}: {c[field]!r} is not in grid.{field}s"
                              f"{' or grid.run_noises' if field == 'noise' else ''} ({values}){hint}")
    c["seeds"] = _chain_seeds(c["seeds"], grid["seeds"], f"{where}.seeds", hint)
    return c


def _check_chain_graph(chains: dict[str, dict], grid: dict[str, Any]) -> dict[str, dict]:
    """The chains together: unique run folders, every upstream a grid method or a chained run, no cycles."""
    # one stage per chain writes runs/<dataset>/<noise>/<name>/ (a folder of its seeds): names are unique per setting
    folders = {(c["dataset"], c["noise"], c["name"]): key for key, c in chains.items()}
    if len(folders) != len(chains):
        raise ParamsError("chains: two entries have the same dataset, noise and name (the same run folder); "
                          "give one another name")
    errors = ErrorCollector()
    for key, c in chains.items():
        with errors.check():
            _check_upstream(key, c, chains, folders, grid)
    errors.raise_if_any()
    return chains


def _check_upstream(key: str, c: dict, chains: dict[str, dict], folders: dict, grid: dict[str, Any]) -> None:
    where = f"chains.{key}.upstream"
    up = folders.get((c["dataset"], c["noise"], c["upstream"]))
    if c["upstream"] not in grid["methods"] and up is None:
        here = [name for (dataset, noise, name) in folders if (dataset, noise) == (c["dataset"], c["noise"])]
        raise ParamsError(
            f"{where}: unknown upstream {c['upstream']!r}{did_you_mean(c['upstream'], [*grid['methods'], *here])}; "
            f"allowed: a method of grid.methods ({', '.join(grid['methods'])}) or a chained run of "
            f"{c['dataset']}/{c['noise']} ({', '.join(here) or 'none'}) (a chained run needs its upstream in the grid; "
            "or drop every chain: -S '~chains' -S '+chains={}', one: -S '~chains.<key>')")
    if up is not None and not set(c["seeds"]) <= set(chains[up]["seeds"]):
        raise ParamsError(f"{where}: the chained run {c['upstream']!r} trains seeds {chains[up]['seeds']}, "
                          f"not every seed of {key!r} ({c['seeds']})")
    seen, cur = {key}, up
    while cur is not None:  # no cycles: follow upstreams until a grid run
        if cur in seen:
            raise ParamsError(f"{where}: the chain {key!r} leads back to itself")
        seen.add(cur)
        cur = folders.get((chains[cur]["dataset"], chains[cur]["noise"], chains[cur]["upstream"]))


def _chain_seeds(seeds: Any, grid_seeds: list[int], where: str, hint: str) -> list[int]:
    """A chain's ``seeds``: ``grid`` -> every seed of grid.seeds; a list -> those seeds (each in grid.seeds)."""
    if seeds == "grid":
        return list(grid_seeds)
    if isinstance(seeds, str) or not seeds or any(isinstance(s, bool) or not isinstance(s, int) for s in seeds):
        raise ParamsError(f"{where}: {seeds!r} is not allowed; allowed values: grid (every seed of grid.seeds) or a "
                          f"non-empty list of seeds of grid.seeds ({grid_seeds})")
    missing = [s for s in seeds if s not in grid_seeds]
    if missing:
        raise ParamsError(f"{where}: {missing} not in grid.seeds ({grid_seeds}){hint}")
    if len(set(seeds)) != len(seeds):
        raise ParamsError(f"{where}: {seeds} names a seed twice")
    return list(seeds)


#: The section this module validates (:data:`noisydml.schema.SECTION_OWNERS`).
SECTION_CHECKS: dict[str, SectionCheck] = {
    "chains": SectionCheck(_check_chains, reads=("grid", "train")),
}
