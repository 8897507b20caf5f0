"""The optimiser and the learning-rate schedules of a fit (``train.optimizer``, ``train.schedule``)."""

from __future__ import annotations

import math
from typing import Callable

import torch

from noisydml.engine.eager_optim import eager


def lr_factor(schedule: dict, epochs: int, steps_per_epoch: int) -> Callable[[int], float]:
    """Learning-rate factor per optimisation step: linear warm-up, then cosine / step / constant."""
    total = epochs * steps_per_epoch
    warmup = schedule["warmup_epochs"] * steps_per_epoch

    if schedule["name"] == "warmup_hold_cosine":
        return _warmup_hold_cosine(schedule)
    if schedule["name"] == "warmup_hold_cosine_fitted":
        return _warmup_hold_cosine(fitted_to_run(schedule, total))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if schedule["name"] == "cosine":
            progress = (step - warmup) / max(1, total - warmup)
            return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
        if schedule["name"] == "step":
            return schedule["gamma"] ** ((step // steps_per_epoch) // schedule["step_epochs"])
        if schedule["name"] == "multistep":  # DCQ's code: lr x 0.1 if epoch >= milestone, for each milestone
            return schedule["gamma"] ** sum(step // steps_per_epoch >= m for m in schedule["milestones"])
        return 1.0

    return factor


def _warmup_hold_cosine(schedule: dict) -> Callable[[int], float]:
    """The SGPS authors' ``SequentialLR([LinearLR, CosineAnnealingLR], milestones=[cosine_from_step])`` in closed
    form: linear from ``warmup_start_factor`` to 1 over ``warmup_steps``, 1 until ``cosine_from_step``, then
    ``(1 + cos(pi t / cosine_steps)) / 2`` with ``t`` the steps since (periodic, as torch's closed form; a run longer
    than ``cosine_from_step + cosine_steps`` climbs back up: :func:`fitted_to_run` is the fitted form)."""
    start, ramp = schedule["warmup_start_factor"], schedule["warmup_steps"]
    begin, period = schedule["cosine_from_step"], schedule["cosine_steps"]

    def factor(step: int) -> float:
        if step >= begin:
            return 0.5 * (1.0 + math.cos(math.pi * (step - begin) / period))
        if step < ramp:
            return start + (1.0 - start) * step / ramp
        return 1.0

    return factor


def fitted_to_run(schedule: dict, total_steps: int) -> dict:
    """``warmup_hold_cosine``'s breakpoints scaled so that its cosine reaches 0 at the run's last step (ours).

    The SGPS authors' schedule (warm-up 1,000, hold to 3,000, cosine T_max 8,000: 0 at step 11,000) was written for
    their run of 12,500 steps (their sampler's ``max_iters`` 8,000 / batch 64 = 125 steps an epoch, 100 epochs);
    torch's closed form is periodic, so a longer run climbs back up (CARS-98N's 14,900 steps would end at 0.48 of
    the peak). Scaling keeps the shape -- the warm-up's and hold's shares of the run -- on any run length, also
    runs shorter than the authors' warm-up (a rehearsal); capping at the design length would instead spend the
    rest of a longer run at lr 0."""
    design = schedule["cosine_from_step"] + schedule["cosine_steps"]
    scale = total_steps / design

    def at(step: int) -> int:
        return int(round(step * scale))

    begin = at(schedule["cosine_from_step"])
    return {**schedule, "warmup_steps": min(at(schedule["warmup_steps"]), begin), "cosine_from_step": begin,
            "cosine_steps": max(1, total_steps - begin)}


def build_optimizer(model: torch.nn.Module, method, opt_cfg: dict) -> torch.optim.Optimizer:
    """The backbone at the base lr, the embedding head at ``head_lr_factor`` x the method's
    :meth:`~noisydml.methods.base.Method.head_lr_factor` x lr (both ours), then the method's own groups
    (:meth:`Method.param_groups`). With a factor of 1 the model stays one group, as before the factor existed,
    so checkpoints keep their layout."""
    head_factor = opt_cfg["head_lr_factor"] * method.head_lr_factor()
    if head_factor == 1.0 or not hasattr(model, "head"):
        groups = [{"params": list(model.parameters()), "lr": opt_cfg["lr"]}]
    else:
        head = {id(p) for p in model.head.parameters()}
        groups = [{"params": [p for p in model.parameters() if id(p) not in head], "lr": opt_cfg["lr"]},
                  {"params": list(model.head.parameters()), "lr": opt_cfg["lr"] * head_factor}]
    groups += method.param_groups(opt_cfg["lr"], opt_cfg["weight_decay"])
    name, wd = opt_cfg["name"], opt_cfg["weight_decay"]
    if name in ("adam", "adamw"):
        betas = tuple(opt_cfg["betas"])  # two numbers (checked with params)
        adam = eager(torch.optim.Adam if name == "adam" else torch.optim.AdamW)
        return adam(groups, lr=opt_cfg["lr"], betas=betas, weight_decay=wd)
    return eager(torch.optim.SGD)(groups, lr=opt_cfg["lr"], weight_decay=wd, momentum=opt_cfg["momentum"])
