"""Every training job of the pipeline is built here (:func:`build_job`) and fitted here (:func:`fit`): the train
stage's runs (the grid's, chains', tuned and every study's), each tune trial and its upstream runs, and each timing
entry. Nothing else in the pipeline constructs a :class:`~noisydml.engine.trainer.Trainer` (tests/test_job.py).

A job is a run's params *after its overrides* (:meth:`noisydml.runs.Run.params`, the one place they are merged),
checked (the method's hyper-parameters, the backbone, a frozen backbone's pretrained weights), its data (a chained
run's upstream labels, weights and inputs applied), its pretrained backbone, its tracker and its checkpoint.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from noisydml.engine.callbacks import stop_after
from noisydml.engine.job import Job
from noisydml.engine.trainer import Trainer
from noisydml.engine.types import RunSpec, TrainResult
from noisydml.methods import check_frozen_backbone, check_method
from noisydml.models import check_backbone
from noisydml.pipeline.layout import Layout
from noisydml.pipeline.pretrained import load_pretrained
from noisydml.pipeline.rundata import RunData, load_upstream

#: Test seam: ``NOISYDML_STOP_AFTER_EPOCH=k`` stops a fit after epoch k's checkpoint, as a kill would.
STOP_AFTER_EPOCH_ENV = "NOISYDML_STOP_AFTER_EPOCH"


@dataclass
class BuiltJob:
    """A job and what its caller writes beside the model: the data it trained on (after a chain's filtering),
    the method's checked hyper-parameters, the upstream run and the pretrained weights it started from."""

    job: Job
    data: RunData
    hparams: dict[str, Any]
    upstream: dict[str, Any]
    pretrained: dict[str, Any]


def check_run_params(params: dict, method: str, where: str | None = None) -> dict[str, Any]:
    """The checks every job's params pass (``params``: a run's, after its overrides; ``where`` names its
    hyper-parameters in an error, default ``methods.<method>``): the method's hyper-parameters (returned, the
    schema's defaults filled in), the backbone and a frozen backbone's weights. tools/check.py runs the same on
    every chain and timing entry."""
    where = where or f"methods.{method}"
    hparams = check_method(params, method, where)
    check_backbone(params["train"], params["weights"])
    check_frozen_backbone(hparams, params["train"], where)
    return hparams


def build_job(params: dict, method: str, seed: int, data: RunData, layout: Layout, checkpoint: Path, *,
              tracker: Callable[[RunSpec, dict], Any] | None, code: tuple[str, ...], where: str,
              chain: dict | None = None, upstream_dir: Path | None = None, pretrained: tuple | None = None,
              held_out_as_test: bool = False) -> BuiltJob:
    """The job of ``method`` at ``seed`` with ``params`` (a run's, overrides applied) on ``data``.

    ``chain``/``upstream_dir``: a chained run trains from that upstream run's labels, weights and inputs.
    ``pretrained``: ``(backbone_state, record)`` already loaded (a tune stage loads them once), else loaded here.
    ``held_out_as_test``: the held-out training classes take the test set's place (tune trials: the test split is
    never handed over; selection on them only where the params select). ``tracker(spec, hparams)`` makes the
    tracker (None: nothing is recorded)."""
    hparams = check_run_params(params, method)
    inputs, init_state, upstream = {}, None, {}
    if chain is not None:
        data, inputs, init_state, upstream = load_upstream(chain, data, upstream_dir, layout.root, where)
    backbone_state, pretrained_record = pretrained if pretrained is not None else load_pretrained(params, layout)
    spec = RunSpec(method=method, method_hparams=hparams, train=params["train"], seed=seed,
                   data_fingerprint=data.fingerprint, evaluate=params["evaluate"], upstream=upstream,
                   pretrained=pretrained_record)
    if held_out_as_test:
        selecting = params["train"]["model_selection"] == "best_validation"
        test_set, val_set = data.val_set, data.val_set if selecting else None
    else:
        test_set, val_set = data.test_set, data.val_set
    job = Job(spec, data.train_set, test_set, checkpoint, tracker=tracker(spec, hparams) if tracker else None,
              runtime=params["runtime"], val_set=val_set, truth=data.truth, sample_ids=data.sample_ids,
              inputs=inputs, init_state=init_state, backbone_state=backbone_state, code=code)
    return BuiltJob(job, data, hparams, upstream, pretrained_record)


def fit(job: Job, stoppable: bool = True) -> TrainResult:
    """Fit ``job``; a fit that fails or is killed ends its tracking run as KILLED. ``stoppable``: the test seam
    (:data:`STOP_AFTER_EPOCH_ENV`) applies to this fit."""
    stop = os.environ.get(STOP_AFTER_EPOCH_ENV)
    try:
        return Trainer(job, callbacks=stop_after(int(stop) if stop and stoppable else None)).fit()
    except BaseException:
        job.tracker.end(status="KILLED")
        raise
