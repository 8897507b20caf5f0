"""params.yaml: loading and validation, one top-level section at a time.

params.yaml is the single source of truth of the pipeline. Every stage calls
:func:`load_params` first with the sections it reads (those dvc.yaml declares
for it, and the ones it only names things from), so a mistake in them (a rate
outside [0, 1], a batch with more classes than the dataset has, ...) stops the
stage before any work, with a message that names the key, the bad value and
what is allowed; a section the stage does not load is neither validated nor
readable there, and its code is not the stage's code.

Each section is validated by the module that owns it
(:data:`noisydml.schema.SECTION_OWNERS`: this module for most, the tuning and
evaluation modules for theirs), imported by name only when a stage loads that
section. Each registry (dataset kinds, noise kinds, methods) declares the
schema of its own entries, validated where a stage uses one. The rules that
span the whole file (every method a module of the catalog, no two runs in one
folder, every study's sections) are :mod:`noisydml.tools.check`'s, which
the launcher and CI run before anything.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Mapping

from noisydml.runtime import RUNTIME_SCHEMA
from noisydml.schema import (
    SECTION_OWNERS, ErrorCollector, Field, ParamsError, ParamsErrors, SectionCheck, _check_value, check_choice,
    check_name, check_section, check_sha256, check_unique, did_you_mean, flow, mapping_or_empty, section_check,
)

__all__ = ["Field", "ParamsError", "check_section", "load_params", "validate_params"]

# --------------------------------------------------------------------------
# The shape of params.yaml
# --------------------------------------------------------------------------

TRAIN_SCHEMA: dict[str, Field] = {
    "backbone": Field(str, "small_cnn", help="a name of noisydml.models.BACKBONES"),
    "backbone_width": Field(int, 16, min=1, help="channels of the first block of small_cnn"),
    "iresnet_width": Field(int, 64, min=1, help="iresnet*: channels of the first stage, doubled by each later stage "
                                                "(arcface_torch and its published weights: 64; another value is ours: "
                                                "a narrower network for the CPU face benchmark)"),
    "pretrained": Field(str, "none", help="where the backbone starts: none | embedded (the pretrain stage's "
                                          "weights) | imagenet (torchvision, ResNets) | a name in `weights` "
                                          "(published weights the pretrain stage fetches) | a .pt/.pth file"),
    "pooling": Field(str, "avg", choices=("avg", "max", "avg+max"),
                     help="global pooling of the backbone's last map: avg, max (the papers' BN-Inception), avg+max"),
    "frozen_bn": Field(bool, False, help="backbone batch norms kept at their loaded statistics (eval mode, fixed)"),
    "embedding_dim": Field(int, 64, min=2),
    "epochs": Field(int, 12, min=1),
    "batch": Field(dict, {"classes": 16, "per_class": 4}),
    "optimizer": Field(dict, {"name": "adam", "lr": 1e-3, "weight_decay": 1e-4}),
    "schedule": Field(dict, {"name": "cosine", "warmup_epochs": 0}),
    "eval_every": Field(int, 1, min=0, help="epochs between test-set monitoring; 0 = final epoch only"),
    "monitor_max_k": Field(int, 1023, min=1,
                           help="ours (evaluate.max_k's default): cap on neighbours retrieved for the monitor's "
                                "MAP@R and R-Precision curves (monitoring only: never selects; evaluate.max_k is the "
                                "evaluate stage's, so changing it re-trains nothing)"),
    "test_check_every_steps": Field(int, 0, min=0,
                                    help="ours: a test-P@1 check every N optimisation steps (0 = none), for the "
                                         "test-selected [best on test] figure only, as the PRISM authors' code "
                                         "selects (every 100 iterations); costs a full test pass per check and "
                                         "never selects the reported model"),
    "validation_classes": Field(int, 0, min=0, help="training classes (by noisy label) held out for model selection"),
    "model_selection": Field(str, "last", choices=("last", "best_validation"),
                             help="the reported model: the last epoch's, or the best validation P@1's"),
    "input": Field(dict, {}, help="how file-stored images become inputs (train.input); arrays ignore it"),
}
#: The papers' input protocol for images stored as files (:mod:`noisydml.data.images`); in-memory arrays (the
#: embedded glyphs) are fed as they are and ignore it.
INPUT_SCHEMA = {
    "crop": Field(int, 224, min=8, help="side of the network input: RandomResizedCrop (train) / CenterCrop (eval)"),
    "resize": Field(int, 256, min=8, help="evaluation: Resize(resize), then CenterCrop(crop)"),
    "scale_min": Field(float, 0.2, min=0.01, max=1.0, help="RandomResizedCrop's scale range (scale_min, 1)"),
    "flip": Field(bool, True, help="random horizontal flip when training"),
    "augment": Field(bool, True, help="ours: false = evaluation transform for training too (debugging)"),
    "normalisation": Field(str, "auto", choices=("auto", "imagenet", "caffe_bgr", "unit"),
                           help="ours: auto = what the weights expect: caffe_bgr (BGR, [0, 255] minus 104/117/128) "
                                "for BN-Inception on weights, ImageNet statistics for a ResNet on ImageNet weights "
                                "or a weights file, unit ([-1, 1]) otherwise"),
}
BATCH_SCHEMA = {
    "classes": Field(int, 16, min=2, help="P: classes per batch"),
    "per_class": Field(int, 4, min=2, help="K: samples per class in a batch"),
}
OPTIMIZER_SCHEMA = {
    "name": Field(str, "adam", choices=("adam", "adamw", "sgd")),
    "lr": Field(float, 1e-3, above=0.0),
    "weight_decay": Field(float, 1e-4, min=0.0),
    "momentum": Field(float, 0.9, min=0.0, max=1.0, help="sgd only"),
    "betas": Field(list, [0.9, 0.999], item_type=float, min=0.0, max=1.0,
                   help="adam / adamw: (beta1, beta2); torch's default (0.9, 0.999); the SGPS authors' code: "
                        "(0.9, 0.95)"),
    "grad_clip_norm": Field(float, 0.0, min=0.0,
                            help="clip the gradient's global L2 norm (model and method) to this before each step; "
                                 "0 = none (the PRISM authors' code); the SGPS authors' code: 1.0"),
    "head_lr_factor": Field(float, 1.0, min=0.0,
                            help="ours: the embedding head's lr is lr x this (a head that starts random on a "
                                 "pretrained backbone may learn faster than the backbone it sits on)"),
}
SCHEDULE_SCHEMA = {
    "name": Field(str, "cosine", choices=("cosine", "step", "multistep", "constant", "warmup_hold_cosine",
                                          "warmup_hold_cosine_fitted"),
                  help="cosine: to 0 over the run; step: x gamma every step_epochs; multistep: x gamma at the start "
                       "of each epoch (0-based) in milestones (DCQ's code; SGPS's faces: 4, 8, 9); warmup_hold_cosine "
                       "(the SGPS authors' SequentialLR): linear from warmup_start_factor over warmup_steps, flat until "
                       "cosine_from_step, then cosine with period 2 x cosine_steps (torch's CosineAnnealingLR, "
                       "which climbs back up past cosine_from_step + cosine_steps); warmup_hold_cosine_fitted "
                       "(ours): the same shape with its three breakpoints scaled so the cosine reaches 0 at the "
                       "run's last step"),
    "warmup_epochs": Field(int, 0, min=0, help="cosine / step / constant: linear warm-up epochs"),
    "step_epochs": Field(int, 10, min=1, help="step schedule: epochs between decays"),
    "gamma": Field(float, 0.1, min=0.0, max=1.0, help="step / multistep schedule: decay factor"),
    "milestones": Field(list, [], item_type=int, min=1,
                        help="multistep: the epochs (0-based) the lr is x gamma from (one at or past train.epochs "
                             "never applies: a shortened run keeps the schedule)"),
    "warmup_steps": Field(int, 0, min=0, help="warmup_hold_cosine: linear warm-up steps (SGPS authors: 1,000)"),
    "warmup_start_factor": Field(float, 0.0025, min=0.0, max=1.0,
                                 help="warmup_hold_cosine: the warm-up's first lr / lr, a factor as torch's "
                                      "LinearLR start_factor (SGPS authors: 1e-6; the default 0.0025 is ours)"),
    "cosine_from_step": Field(int, 0, min=0, help="warmup_hold_cosine: the step cosine starts (SGPS authors: 3,000)"),
    "cosine_steps": Field(int, 1, min=1, help="warmup_hold_cosine: cosine's T_max in steps (SGPS authors: 8,000)"),
}
GRID_SCHEMA = {
    "datasets": Field(list, item_type=str),
    "noises": Field(list, item_type=str),
    "run_noises": Field(list, [], item_type=str,
                        help="noise settings clustered on a grid run's embeddings (features.source: run); each "
                             "dataset's run is named in noise_runs.<dataset>-<noise>"),
    "methods": Field(list, item_type=str),
    "seeds": Field(list, [0], item_type=int, min=0),
}
TOP_LEVEL = ("grid", "method_sets", "datasets", "noise", "noise_runs", "pretrain", "weights", "train", "runtime",
             "evaluate", "methods", "chains", "tuning", "tracking", "report", "timing", "figures")
#: Published backbone weights ``train.pretrained`` can name; the pretrain stage fetches and checks them.
WEIGHTS_SCHEMA = {
    "backbone": Field(str, help="the train.backbone these weights are for"),
    "url": Field(str, help="where the weights file is downloaded from (empty: put it in place by hand)"),
    "sha256": Field(str, help="the file's sha256: all 64 hex digits, or the prefix its publisher names the file "
                              "by (at least 8; torch hub's convention, e.g. resnet50-0676ba61.pth)"),
    "where": Field(str, "", help="where to get the file by hand when the url fails"),
}
#: The pretrain stage (``train.pretrained: embedded``): the backbone learns to classify an embedded source set
#: disjoint from every class of its dataset: source glyphs (:func:`noisydml.data.glyphs.source_chars`), source
#: motifs (:func:`noisydml.data.motifs.source_genera`) or source identities (:func:`noisydml.data.faces.generate_source`).
#: The classes each source set has: 567 characters matplotlib's fonts give (18 s to count, so checked by this bound
#: and tested against the count), 576 motif species (144 source genera x 4); faces are procedural (ours: a bound).
PRETRAIN_SOURCE_CLASSES = {"glyphs": 567, "motifs": 576, "faces": 100000}
PRETRAIN_SCHEMA = {
    "source": Field(str, "glyphs", choices=tuple(PRETRAIN_SOURCE_CLASSES),
                    help="the embedded source set: glyphs (grey characters) | motifs (RGB shapes) | faces "
                         "(identities no faces dataset has)"),
    "classes": Field(int, 400, min=2, help="source classes (at most the source set's: glyphs 567, motifs 576)"),
    "images_per_class": Field(int, 32, min=6, help="rendered views per source character (4 held out)"),
    "image_size": Field(int, 32, min=8, help="side of the source images"),
    "epochs": Field(int, 15, min=1),
    "batch_size": Field(int, 128, min=2),
    "lr": Field(float, 0.002, above=0.0, help="Adam, cosine schedule"),
    "weight_decay": Field(float, 0.0001, min=0.0),
    "seed": Field(int, 0, min=0),
}
#: Which run's embeddings a run-sourced noise setting clusters, on one dataset (``noise_runs.<dataset>-<noise>``):
#: the DVC stage ``corrupt_from_run@<dataset>-<noise>`` depends on that run's folder.
NOISE_RUN_SCHEMA = {
    "dataset": Field(str, help="a dataset of grid.datasets"),
    "noise": Field(str, help="a noise setting with features.source: run"),
    "run": Field(dict, help="{noise, method, seed}: the grid run (same dataset) whose training embeddings are clustered"),
}
NOISE_RUN_RUN_SCHEMA = {
    "noise": Field(str, help="a noise setting of grid.noises"),
    "method": Field(str, help="a method of grid.methods"),
    "seed": Field(int, min=0, help="a seed of grid.seeds"),
}
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
TRACKING_SCHEMA = {
    "experiment": Field(str, "noisydml"),
}
TIMING_SCHEMA = {
    "dataset": Field(str, help="the dataset (in grid.datasets) every timed method trains on"),
    "noise": Field(str, help="the noise setting (in grid.noises) whose labels every timed method trains on"),
    "epochs": Field(int, 2, min=1, help="epochs per timed method; the first is not counted when there are more"),
    "entries": Field(dict, {}, help="name -> {label, method, hparams (overrides of methods.<method>)}; "
                                    "empty = no timing stage"),
}
TIMING_ENTRY_SCHEMA = {
    "label": Field(str),
    "method": Field(str),
    "hparams": Field(dict, {}),
}
def noises_of(grid: Mapping) -> list[str]:
    """Every noise setting the grid trains on: ``grid.noises`` then ``grid.run_noises``."""
    return list(grid["noises"]) + list(grid.get("run_noises", []))


def check_model_selection(train: Mapping[str, Any], where: str) -> None:
    """A train section (params.yaml's, or a chained run's with its overrides) that selects on validation holds
    classes out for it: the test set never selects a model."""
    if train["model_selection"] == "best_validation" and train["validation_classes"] == 0:
        raise ParamsError(f"{where}.model_selection: 'best_validation' needs {where}.validation_classes > 0 "
                          "(held-out training classes; the test set is never used to select a model)")


def _check_named_sections(section: Any, key: str, what: str) -> dict[str, dict]:
    """``{name: {kind: ..., ...}}`` sections (datasets, noise settings): names and the ``kind`` key.

    The body of each entry is validated by its kind's registry when a stage uses it
    (:func:`noisydml.data.registry.check_dataset`, :func:`noisydml.noise.check_noise`), or all at once
    by :func:`noisydml.tools.check.check_all`.
    """
    if not isinstance(section, Mapping) or not section:
        raise ParamsError(f"{key}: expected a non-empty mapping of {what} name -> settings")
    out = {}
    for name, body in section.items():
        where = f"{key}.{check_name(name, key)}"
        if not isinstance(body, Mapping) or "kind" not in body:
            raise ParamsError(f"{where}: expected a mapping with a 'kind' key")
        out[name] = dict(body)
    return out


def _check_timing(section: Any, p: dict[str, Any], raw: Mapping[str, Any]) -> dict[str, Any]:
    """The training-time table (PRISM's Table 4 layout); each entry's hyper-parameters are validated by
    the timing stage, with its method's schema."""
    timing = check_section(section, TIMING_SCHEMA, "timing")
    check_choice(timing["dataset"], p["grid"]["datasets"], "timing.dataset", "dataset of grid.datasets")
    check_choice(timing["noise"], p["grid"]["noises"], "timing.noise", "noise setting",
                 " (the noise settings of grid.noises)")
    entries = {}
    for name, raw_entry in timing["entries"].items():
        where = f"timing.entries.{check_name(name, 'timing.entries')}"
        entry = check_section(raw_entry, TIMING_ENTRY_SCHEMA, where)
        check_choice(entry["method"], list(raw["methods"]), f"{where}.method", "method")
        entries[name] = entry
    check_unique([e["label"] for e in entries.values()], "timing.entries.*.label")
    timing["entries"] = entries
    return timing


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


def clusters_a_run(noise_setting: Mapping) -> bool:
    """Whether a noise setting's labels are made from a run's embeddings (``features.source: run``)."""
    features = noise_setting.get("features")
    return isinstance(features, Mapping) and features.get("source") == "run"


def _check_run_noises(grid: dict, noise: dict) -> None:
    """Noise made from a run's embeddings has its own DVC stages (``corrupt_from_run``, ``train_on_run_noise``)
    whose dependency on that run DVC can see; the data-only noises of ``grid.noises`` have none."""
    for i, name in enumerate(grid["noises"]):
        if clusters_a_run(noise[name]):
            raise ParamsError(
                f"grid.noises[{i}]: {name!r} is clustered on a run's embeddings (features.source: run); list it in "
                "grid.run_noises instead and name its run per dataset in noise_runs.<dataset>-<noise>")
    check_unique(grid["run_noises"], "grid.run_noises")
    for i, name in enumerate(grid["run_noises"]):
        check_choice(name, list(noise), f"grid.run_noises[{i}]", "noise setting")
        if not clusters_a_run(noise[name]):
            raise ParamsError(f"grid.run_noises[{i}]: {name!r} is not clustered on a run's embeddings "
                              "(features.source: run); list it in grid.noises")
    # (a name in both lists fails one of the two loops above: it either clusters a run or it does not)


def _check_noise_runs(section: Any, p: dict[str, Any], raw: Mapping[str, Any]) -> dict[str, dict]:
    """``noise_runs.<dataset>-<noise>``: the grid run whose training embeddings a run-sourced noise clusters."""
    section = mapping_or_empty(section, "noise_runs", "'<dataset>-<noise>' -> {dataset, noise, run}")
    grid = p["grid"]
    entries: dict[str, dict] = {}
    for key, body in section.items():
        where = f"noise_runs.{key}"  # the key is checked against its dataset and noise below
        e = check_section(body, NOISE_RUN_SCHEMA, where)
        e["run"] = check_section(e["run"], NOISE_RUN_RUN_SCHEMA, f"{where}.run")
        check_choice(e["dataset"], grid["datasets"], f"{where}.dataset", "dataset of grid.datasets")
        check_choice(e["noise"], list(p["noise"]), f"{where}.noise", "noise setting")
        if not clusters_a_run(p["noise"][e["noise"]]):
            raise ParamsError(f"{where}.noise: {e['noise']!r} does not cluster a run's embeddings "
                              "(its features.source is not 'run')")
        expected = f"{e['dataset']}-{e['noise']}"
        if key != expected:
            raise ParamsError(f"{where}: the key must be {expected!r} ('<dataset>-<noise>'; it names the stage "
                              f"corrupt_from_run@{expected} and the folder data/noisy/{e['dataset']}/{e['noise']})")
        run = e["run"]
        for field, values in (("noise", grid["noises"]), ("method", grid["methods"]), ("seed", grid["seeds"])):
            if run[field] not in values:
                raise ParamsError(
                    f"{where}.run.{field}: {run[field]!r} is not in grid.{field}s ({values}): the run whose "
                    f"embeddings are clustered must be one the grid trains")
        entries[key] = e
    for name in grid["run_noises"]:
        for dataset in grid["datasets"]:
            if f"{dataset}-{name}" not in entries:
                raise ParamsError(
                    f"grid.run_noises: {name!r} on dataset {dataset!r} needs noise_runs.{dataset}-{name}: "
                    f"{{dataset: {dataset}, noise: {name}, run: {{noise: ..., method: ..., seed: ...}}}} "
                    "(the grid run whose embeddings it clusters)")
    return entries


def _check_weights(section: Any, p: dict[str, Any], raw: Mapping[str, Any]) -> dict[str, dict]:
    if not isinstance(section, Mapping):
        raise ParamsError(f"weights: expected a mapping of name -> {{backbone, url, sha256, where}}, got {section!r}")
    out = {}
    for name, body in section.items():
        where = f"weights.{check_name(name, 'weights')}"
        entry = check_section(body, WEIGHTS_SCHEMA, where)
        entry["sha256"] = check_sha256(entry["sha256"], f"{where}.sha256", min_digits=8)
        out[name] = entry
    return out


def _check_methods(section: Any, p: dict[str, Any], raw: Mapping[str, Any]) -> dict[str, dict]:
    """``methods``: hyper-parameters per method name. Each entry is validated by its method's schema where a stage
    trains it (:func:`noisydml.methods.check_method`); that every name is a module of the method catalog is
    :mod:`noisydml.tools.check`'s rule (and a stage refuses an unknown method it is asked to train)."""
    if not isinstance(section, Mapping):
        raise ParamsError("methods: expected a mapping of method name -> hyper-parameters")
    return {check_name(name, "methods"): dict(body or {}) for name, body in section.items()}


def _check_train(section: Any, p: dict[str, Any], raw: Mapping[str, Any]) -> dict[str, Any]:
    """``train`` and its sub-sections, every problem at once: its own keys and each sub-section's are checked
    whatever else failed; a rule that reads a key or section that failed is skipped (that one's problem is
    reported)."""
    errors = ErrorCollector()
    section = {} if section is None else section
    if not isinstance(section, Mapping):
        raise ParamsError(f"train: expected a mapping, got {section!r}")
    subsections = (("batch", BATCH_SCHEMA), ("optimizer", OPTIMIZER_SCHEMA), ("schedule", SCHEDULE_SCHEMA),
                   ("input", INPUT_SCHEMA))
    train: dict[str, Any] | None = None
    with errors.check():
        train = check_section(section, TRAIN_SCHEMA, "train")
    valid: dict[str, dict] = {}
    for key, schema in subsections:
        with errors.check():
            valid[key] = check_section((train or section).get(key), schema, f"train.{key}")
    if train is None:  # the top-level keys' problems are listed; the rules below read them
        errors.raise_if_any()
    train.update(valid)
    with errors.check():
        if "optimizer" in valid and len(train["optimizer"]["betas"]) != 2:
            raise ParamsError(f"train.optimizer.betas: {train['optimizer']['betas']!r}; allowed: two numbers "
                              "[beta1, beta2] in [0, 1]")
    with errors.check():
        if "input" in valid and train["input"]["resize"] < train["input"]["crop"]:
            raise ParamsError(f"train.input.resize: {train['input']['resize']} is below train.input.crop "
                              f"({train['input']['crop']}); allowed: {train['input']['crop']} or more")
    with errors.check():
        if "schedule" in valid and train["schedule"]["warmup_epochs"] >= train["epochs"]:
            raise ParamsError(
                f"train.schedule.warmup_epochs: {train['schedule']['warmup_epochs']} must be below "
                f"train.epochs ({train['epochs']})"
            )
    with errors.check():
        schedule = train.get("schedule") if "schedule" in valid else None
        if schedule and schedule["name"] == "multistep":
            milestones = schedule["milestones"]
            if not milestones or milestones != sorted(set(milestones)):  # one at or past train.epochs never applies
                raise ParamsError(f"train.schedule.milestones: {milestones}; allowed with name multistep: epochs "
                                  "(0-based), strictly increasing, at least one")
    with errors.check():
        check_model_selection(train, "train")
    weights = p.get("weights")
    with errors.check():
        if weights is not None and train["pretrained"] in weights \
                and weights[train["pretrained"]]["backbone"] != train["backbone"]:
            raise ParamsError(f"train.pretrained: weights {train['pretrained']!r} are for backbone "
                              f"{weights[train['pretrained']]['backbone']!r}, train.backbone is {train['backbone']!r}")
    with errors.check():
        if "batch" in valid and "runtime" in p:
            ranks, batch = p["runtime"]["processes"], train["batch"]
            rows = batch["classes"] * batch["per_class"]
            if rows % ranks:
                divisors = [d for d in range(1, rows + 1) if rows % d == 0 and d <= 16]
                raise ParamsError(f"runtime.processes: {ranks} ranks cannot split a batch of {rows} rows (train.batch: "
                                  f"{batch['classes']} classes x {batch['per_class']}) evenly; allowed: one of "
                                  f"{divisors}, or a batch whose rows are a multiple of it")
    errors.raise_if_any()
    return train


def _check_pretrain(section: Any, p: dict[str, Any], raw: Mapping[str, Any]) -> dict[str, Any]:
    pretrain = check_section(section, PRETRAIN_SCHEMA, "pretrain")
    available = PRETRAIN_SOURCE_CLASSES[pretrain["source"]]
    if pretrain["classes"] > available:
        raise ParamsError(f"pretrain.classes: {pretrain['classes']} is above the maximum {available} (the "
                          f"{pretrain['source']} source set's classes); allowed: 2..{available}")
    return pretrain


def _check_runtime(section: Any, p: dict[str, Any], raw: Mapping[str, Any]) -> dict[str, Any]:
    runtime = check_section(section, RUNTIME_SCHEMA, "runtime")
    if runtime["numerics"] == "portable" and runtime["threads"] == 0:
        raise ParamsError("runtime.threads: 0 (the host's core count) with runtime.numerics: portable; allowed: a "
                          "fixed count >= 1 (the thread count changes the bits), or runtime.numerics: native")
    return runtime


def unknown_noise(name: Any, defined: Mapping[str, Any], where: str) -> str:
    """The refusal of a noise setting ``name`` that ``noise`` does not define: a near miss only among the
    settings of the same family (``sym30`` is not a typo of ``sympc30``, another kind), and how to define it,
    from its family's definition where there is one (``sym30``: ``sym50``'s with rate 0.3)."""
    import re

    def family(n: Any) -> str:
        match = re.match(r"[A-Za-z_]*?(?=\d|$)", str(n))
        return match.group(0) if match else str(n)

    kin = [n for n in defined if family(n) == family(name)]
    digits = re.search(r"(\d+)$", str(name))
    template = next((defined[n] for n in kin if isinstance(defined[n], Mapping) and "rate" in defined[n]), None)
    if template is not None and digits and 0 < int(digits.group(1)) < 100:  # a rate of a family: no near miss
        body = {**template, "rate": int(digits.group(1)) / 100}
        return (f"{where}: unknown noise setting {name!r}; defined: {', '.join(sorted(defined))}; define it first, "
                f"as {kin[0]} is: -S '+noise.{name}={flow(body)}'")
    else:
        how = "define it first: -S '+noise.{name}={{kind: ..., ...}}' (README \"Changing the grid\")".format(name=name)
    return (f"{where}: unknown noise setting {name!r}{did_you_mean(name, kin)}; defined: "
            f"{', '.join(sorted(defined)) or '(none)'}; {how}")


def _check_grid(section: Any, p: dict[str, Any], raw: Mapping[str, Any]) -> dict[str, Any]:
    """``grid``: every name must be defined in its section of the file (the sections themselves are validated by
    the stages that load them); every problem at once."""
    grid = check_section(section, GRID_SCHEMA, "grid")
    errors = ErrorCollector()
    for key, defined, what in (("datasets", "datasets", "dataset"), ("noises", "noise", "noise setting"),
                               ("methods", "methods", "method")):
        with errors.check():
            if not grid[key]:
                raise ParamsError(f"grid.{key}: must list at least one {what}; allowed: names defined in `{defined}`")
            check_unique(grid[key], f"grid.{key}")
        names = list(raw[defined]) if isinstance(raw.get(defined), Mapping) else []
        for i, name in enumerate(grid[key]):
            with errors.check():
                if key == "noises" and name not in names:
                    raise ParamsError(unknown_noise(name, raw.get("noise") or {}, f"grid.noises[{i}]"))
                check_choice(name, names, f"grid.{key}[{i}]", what)
    with errors.check():
        if not grid["seeds"]:
            raise ParamsError("grid.seeds: [] trains nothing; allowed: a non-empty list of seeds, e.g. [0] or [0, 1, 2]")
        check_unique(grid["seeds"], "grid.seeds")
    errors.raise_if_any()  # the rule below reads the noise settings the grid names
    _check_run_noises(grid, raw["noise"])
    return grid


def _check_figures(section: Any, p: dict[str, Any], raw: Mapping[str, Any]) -> dict[str, Any]:
    """``figures.<key>``: sections the studies own (noisydml.studies), validated by each study where it is used and
    all at once by noisydml.tools.check: editing a study's check re-runs that study's stages, not the grid."""
    return {key: copy.deepcopy(body) for key, body in
            mapping_or_empty(section, "figures", "study sections (noisydml.studies)").items()}


def _check_method_sets(section: Any, p: dict[str, Any], raw: Mapping[str, Any]) -> dict[str, list]:
    """``method_sets``: named lists of methods (params.yaml uses YAML anchors so grid.methods can point at one)."""
    out = {}
    for set_name, names in (section or {}).items():
        where = f"method_sets.{set_name}"
        _check_value(names, Field(list, item_type=str), where)
        for i, m in enumerate(names):
            check_choice(m, list(raw["methods"]), f"{where}[{i}]", "method")
        out[set_name] = list(names)
    return out


#: The sections this module validates (:data:`noisydml.schema.SECTION_OWNERS`).
SECTION_CHECKS: dict[str, SectionCheck] = {
    "datasets": SectionCheck(lambda s, p, raw: _check_named_sections(s, "datasets", "dataset")),
    "noise": SectionCheck(lambda s, p, raw: _check_named_sections(s, "noise", "noise")),
    "methods": SectionCheck(_check_methods),
    "weights": SectionCheck(_check_weights),
    "runtime": SectionCheck(_check_runtime),
    "train": SectionCheck(_check_train, reads=("weights", "runtime")),
    "pretrain": SectionCheck(_check_pretrain),
    "tracking": SectionCheck(lambda s, p, raw: check_section(s, TRACKING_SCHEMA, "tracking")),
    "grid": SectionCheck(_check_grid),
    "noise_runs": SectionCheck(_check_noise_runs, needs=("grid", "noise")),
    "chains": SectionCheck(_check_chains, reads=("grid", "train")),
    "timing": SectionCheck(_check_timing, needs=("grid",)),
    "figures": SectionCheck(_check_figures),
    "method_sets": SectionCheck(_check_method_sets),
}


def sections_with_needs(sections) -> list[str]:
    """``sections`` and every section they need, in an order where each comes after what it needs."""
    ordered: list[str] = []

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in ordered:
            return
        if name in path:
            raise RuntimeError(f"params sections need each other in a cycle: {' -> '.join((*path, name))}")
        check = section_check(name)
        for need in (*check.needs, *check.reads):
            visit(need, (*path, name))
        ordered.append(name)

    for name in sections:
        if name not in SECTION_OWNERS:
            raise ParamsError(f"params: unknown section {name!r}; allowed: {', '.join(TOP_LEVEL)}")
        visit(name, ())
    return ordered


def validate_params(raw: Any, sections=None) -> dict[str, Any]:
    """Validate the shape of params.yaml and ``sections`` (top-level names; None: every section), with the
    sections they need; return those sections only, validated, with defaults filled in. Every problem found is
    raised at once (:class:`noisydml.schema.ParamsErrors`; :func:`validate_sections`).

    A stage validates, and can read, only the sections it loads: what a registry owns inside them (a dataset's,
    a noise setting's or a method's own keys, the backbone name) is validated by the stage that uses it, with that
    registry, so a stage imports (and DVC tracks) only the code it runs. :func:`noisydml.tools.check.check_all`
    validates everything at once, with the rules that span sections (``noisydml check``; the launcher, CI and the
    tests run it).
    """
    p, errors = validate_sections(raw, sections)
    errors.raise_if_any()
    return p


def validate_sections(raw: Any, sections=None) -> tuple[dict[str, Any], ErrorCollector]:
    """:func:`validate_params`, keeping going: the sections that validated, and every problem found (a section
    whose needed section failed is not checked: its problem is that one's)."""
    errors = ErrorCollector()
    if not isinstance(raw, Mapping):
        raise ParamsError(f"params: expected a mapping at the top level, got {type(raw).__name__}")
    for key in sorted(set(raw) - set(TOP_LEVEL)):
        with errors.check():
            check_choice(key, TOP_LEVEL, "params", "top-level key")
    for key in TOP_LEVEL:
        if key not in raw and key != "method_sets":  # named lists, for YAML anchors: may be left out
            errors.messages.append(f"params: missing required section {key!r} (no hidden defaults: every section "
                                   "is written out in params.yaml)")
    p: dict[str, Any] = {}
    wanted = sections_with_needs(TOP_LEVEL if sections is None else sections)
    for name in wanted:
        check = section_check(name)
        key = check.source or name
        if check.source and check.source in wanted:
            continue  # the whole section is loaded too
        if name not in raw and name in TOP_LEVEL and name != "method_sets":
            continue  # said above
        if any((section_check(need).source or need) not in p for need in check.needs):
            continue  # a section it reads failed: that one's problem is reported
        with errors.check():
            p[key] = check.check(raw.get(key), p, raw)
    return p, errors


def read_params_file(path: str | Path) -> Any:
    """A params file as DVC reads it: YAML 1.2 (``3e-05`` is a float, as ``dvc exp run -S`` writes it; PyYAML's
    YAML 1.1 reads it as a string) by ruamel.yaml's safe loader, the one DVC uses, which refuses a key written
    twice in one mapping (PyYAML keeps the last)."""
    from ruamel.yaml import YAML
    from ruamel.yaml.constructor import DuplicateKeyError
    from ruamel.yaml.error import YAMLError

    path = Path(path)
    if not path.is_file():
        raise ParamsError(f"{path}: no such file; run from the repository root or name the params file")
    try:
        return YAML(typ="safe").load(path.read_text())
    except DuplicateKeyError as e:
        raise ParamsError(f"{path}: a key is written twice in one mapping (DVC refuses the file too): "
                          f"{e.problem} {e.problem_mark}".strip()) from None
    except YAMLError as e:
        raise ParamsError(f"{path}: not valid YAML: {e}") from None


def load_params(path: str | Path = "params.yaml", sections=None) -> dict[str, Any]:
    """Read (:func:`read_params_file`) and validate (:func:`validate_params`) ``sections`` of params.yaml (None:
    every section)."""
    raw = read_params_file(path)
    try:
        return validate_params(raw, sections)
    except ParamsErrors as e:
        raise ParamsErrors(e.messages, prefix=f"{path}: ") from None
    except ParamsError as e:
        raise ParamsError(f"{path}: {e}") from None


#: Command-line option -> (the grid list it must be in, its type).
GRID_KEYS = {"dataset": ("datasets", str), "noise": ("noises", str), "method": ("methods", str), "seed": ("seeds", int)}


def check_in_grid(params: dict, **names) -> None:
    """Refuse to run an item that params.yaml's grid does not list (a stale stage name, a typo).

    A noise is in the grid when it is in ``grid.noises`` or ``grid.run_noises``, or (made but not trained on)
    when ``noise_runs`` has an entry for it on the dataset."""
    grid = params["grid"]
    for key, value in names.items():
        section = GRID_KEYS[key][0]
        allowed = noises_of(grid) if key == "noise" else grid[section]
        if key == "noise" and f"{names.get('dataset')}-{value}" in params["noise_runs"]:
            continue
        if value not in allowed:
            where = "grid.noises or grid.run_noises" if key == "noise" else f"grid.{section}"
            raise ParamsError(f"--{key} {value!r} is not in {where} ({allowed})")
