"""``train``: the backbone, the batch, the optimiser and schedule, model selection and the input protocol."""

from __future__ import annotations

from typing import Any, Mapping

from noisydml.schema import ErrorCollector, Field, ParamsError, SectionCheck, check_section


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


def check_model_selection(train: Mapping[str, Any], where: str) -> None:
    """A train section (params.yaml's, or a chained run's with its overrides) that selects on validation holds
    classes out for it: the test set never selects a model."""
    if train["model_selection"] == "best_validation" and train["validation_classes"] == 0:
        raise ParamsError(f"{where}.model_selection: 'best_validation' needs {where}.validation_classes > 0 "
                          "(held-out training classes; the test set is never used to select a model)")


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


#: The section this module validates (:data:`noisydml.schema.SECTION_OWNERS`).
SECTION_CHECKS: dict[str, SectionCheck] = {
    "train": SectionCheck(_check_train, reads=("weights", "runtime")),
}
