"""The tune stage: one tuning study (dataset, noise, method) -> ``tuning/<dataset>/<noise>/<method>/``.

The protocol is :mod:`noisydml.tuning`'s. The search is Optuna's (its sampler, its study and trial records); what
is ours is how a trial trains and is scored, and how a killed study resumes:

- **storage**: Optuna's journal file (``journal.log``, append-only) in the stage's output, which DVC keeps between
  runs (``persist: true``): a killed study resumes with the trials it had. ``settings.json`` beside it fingerprints
  everything a trial's result depends on but the budget (params of the method and of train, the tuning settings,
  the data, the code): a study of other settings starts afresh; raising ``tuning.trials`` keeps the trials run.
- **the same trials after a kill**: trial ``k`` is asked from a sampler seeded ``tuning.seed + k`` over the
  trials before it, so it is the same whether the study ran through or was killed and resumed; a trial killed
  mid-training (Optuna state RUNNING, its values already stored) resumes from its last epoch's checkpoint
  (``.checkpoints/tuning/...``, outside DVC's outputs) and is then told its score.
- **no test data**: a trial trains on the noisy training labels minus ``tuning.validation_classes`` held-out
  classes and is scored on those (P@1 of the last epoch); the trainer is never handed the test split.

Outputs: ``journal.log`` and ``settings.json`` (Optuna's record), ``trials.csv`` (one row per trial: values and
validation P@1), ``trials/<k>.csv`` (each trial's epochs) and ``chosen.json``: the values of the best trial, which
the tuned runs read, and how they were chosen (budget, sampler, the first trials' scores, the best score).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import pandas as pd

from noisydml import io
from noisydml.engine.trainer import RunSpec, Trainer, code_fingerprint
from noisydml.methods import check_frozen_backbone, check_method
from noisydml.models import check_backbone
from noisydml.pipeline.layout import Layout
from noisydml.pipeline.pretrained import load_pretrained
from noisydml.pipeline.rundata import load_run_data
from noisydml.schema import ParamsError
from noisydml.tracking import MlflowTracker, mlflow_experiment, standard_tags
from noisydml.tuning import CHOSEN_FILE, assign, first_trials, study_folder, study_name

JOURNAL = "journal.log"
SETTINGS = "settings.json"


def tune(params: dict, dataset: str, noise: str, method: str, layout: Layout = Layout()) -> Path:
    """Run (or resume) the tuning study of ``method`` on ``dataset``/``noise``; write its outputs; return the folder."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    tuning = params["tuning"]
    space = tuning["spaces"][method]
    folder = layout.root / study_folder(dataset, noise, method)
    data = load_run_data(dataset, noise, layout, tuning["validation_classes"], tuning["seed"])
    trainer = _TrialTrainer(params, dataset, noise, method, data, layout)
    _start_afresh_unless_same(folder, _settings(params, method, data.fingerprint, trainer.pretrained, optuna.__version__))
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(folder / JOURNAL)))
    name = study_name(dataset, noise, method)
    study = optuna.create_study(study_name=name, storage=storage, direction="maximize", load_if_exists=True)
    if not study.trials:
        for values in first_trials(params, method, space):
            study.enqueue_trial(values, user_attrs={"source": "first"})
    distributions = {key: _distribution(optuna, e) for key, e in space.items()}
    budget = tuning["trials"]
    while True:
        trials = study.get_trials(deepcopy=False)
        killed = [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
        if killed:  # a trial killed mid-training: its values are stored; train it on from its checkpoint
            trial_number, values = killed[0].number, killed[0].params
        elif sum(t.state == optuna.trial.TrialState.COMPLETE for t in trials) >= budget:
            break
        else:  # trial k from a sampler seeded seed + k: the same trial whether or not the study was killed
            number = len(trials)
            asking = optuna.load_study(study_name=name, storage=storage,
                                       sampler=_sampler(optuna, tuning, tuning["seed"] + number))
            trial = asking.ask(distributions)
            trial_number, values = trial.number, trial.params
        print(f"tune {name}: trial {trial_number + 1}/{budget} {_short(values)}", flush=True)
        score = trainer.score(trial_number, values, folder)
        study.tell(trial_number, score)
        print(f"tune {name}: trial {trial_number + 1}/{budget} validation P@1 {score:.4f}", flush=True)
    _write_outputs(study, params, method, budget, folder)
    return folder


def _settings(params: dict, method: str, data_fingerprint: str, pretrained: dict, optuna_version: str) -> dict:
    """What every trial's result depends on, but the budget (raising it keeps the trials run)."""
    tuning = {k: v for k, v in params["tuning"].items() if k not in ("trials", "datasets", "noises", "methods")}
    tuning["spaces"] = {method: params["tuning"]["spaces"][method]}
    return {"method": method, "hparams": params["methods"][method], "train": params["train"], "tuning": tuning,
            "evaluate": {k: params["evaluate"][k] for k in ("max_k", "device")}, "data": data_fingerprint,
            "pretrained": pretrained,
            "code": code_fingerprint(), "optuna": optuna_version}


def _start_afresh_unless_same(folder: Path, settings: dict) -> None:
    blob = json.dumps(settings, sort_keys=True, default=str)
    digest = hashlib.sha256(blob.encode()).hexdigest()
    record = folder / SETTINGS
    if record.exists() and json.loads(record.read_text()).get("sha256") != digest:
        print(f"{folder}: its trials were run with other settings (params, data or code): starting afresh")
        shutil.rmtree(folder)
    if not record.exists():
        if folder.exists():  # a folder without its settings: never a study of these settings
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        io.write_json(record, {"sha256": digest, "settings": json.loads(blob)})


def _distribution(optuna, entry: dict):
    if "choices" in entry:
        return optuna.distributions.CategoricalDistribution(entry["choices"])
    if entry["integer"]:
        return optuna.distributions.IntDistribution(entry["low"], entry["high"], log=entry["log"])
    return optuna.distributions.FloatDistribution(float(entry["low"]), float(entry["high"]), log=entry["log"])


def _sampler(optuna, tuning: dict, seed: int):
    if tuning["sampler"]["name"] == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=tuning["sampler"]["startup_trials"])


def _short(values: dict) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())


class _TrialTrainer:
    """Trains a trial (the method with its values) on the training classes kept and scores it on the held-out ones."""

    def __init__(self, params: dict, dataset: str, noise: str, method: str, data, layout: Layout):
        self.params, self.dataset, self.noise, self.method = params, dataset, noise, method
        self.data, self.layout = data, layout
        kept, wanted = len(set(data.train_set.labels.tolist())), params["train"]["batch"]["classes"]
        if kept < wanted:
            held = params["tuning"]["validation_classes"]
            raise ParamsError(f"tuning.validation_classes: {held} held out of {dataset}/{noise}'s training labels "
                              f"leaves {kept} classes to train on, fewer than train.batch.classes ({wanted}); allowed: "
                              f"at most {kept + held - wanted}")
        self.backbone_state, self.pretrained = load_pretrained(params, layout)

    def checkpoint(self, number: int) -> Path:
        return (self.layout.root / ".checkpoints" / study_folder(self.dataset, self.noise, self.method)
                / f"trial{number}" / "last.pt")

    def score(self, number: int, values: dict, folder: Path) -> float:
        params = assign(self.params, self.method, values)
        # the last epoch's model, scored on held-out training classes; ours: the tuning split's, not train's
        params["train"].update(validation_classes=self.params["tuning"]["validation_classes"], model_selection="last")
        hparams = check_method(params, self.method)
        check_backbone(params["train"], params["weights"])
        check_frozen_backbone(hparams, params["train"], f"methods.{self.method}")
        seed = params["tuning"]["seed"]
        spec = RunSpec(method=self.method, method_hparams=hparams, train=params["train"], seed=seed,
                       data_fingerprint=self.data.fingerprint, evaluate=params["evaluate"], pretrained=self.pretrained)
        name = study_name(self.dataset, self.noise, self.method)
        tracker = MlflowTracker(
            f"{mlflow_experiment(params, self.dataset)}-tuning", f"{self.method} · {self.noise} · trial {number}",
            params={"dataset": self.dataset, "noise": self.noise, "method": self.method, "trial": number,
                    "values": values, "method_hparams": hparams, "train": params["train"]},
            tags={"dvc_stage": f"tune@{name}", "dataset": self.dataset, "noise": self.noise, "method": self.method,
                  "trial": str(number), "run_fingerprint": spec.fingerprint(), **standard_tags(self.layout.root)})
        # NOISYDML_STOP_AFTER_EPOCH=k (NOISYDML_STOP_IN_TRIAL=t: in trial t only) stops as a kill would (tests)
        stop = os.environ.get("NOISYDML_STOP_AFTER_EPOCH")
        in_trial = os.environ.get("NOISYDML_STOP_IN_TRIAL")
        stop_here = stop and (in_trial is None or int(in_trial) == number)
        # the held-out classes are the trainer's test set: the test split is never handed to it
        trainer = Trainer(spec, self.data.train_set, self.data.val_set, self.checkpoint(number), tracker=tracker,
                          runtime=params["runtime"], truth=self.data.truth, sample_ids=self.data.sample_ids,
                          stop_after_epoch=int(stop) if stop_here else None, backbone_state=self.backbone_state)
        started = time.time()
        try:
            result = trainer.fit()
        except BaseException:
            tracker.end(status="KILLED")
            raise
        history = pd.DataFrame(result.history).rename(columns=lambda c: c.replace("test_", "val_", 1))
        io.write_with(folder / "trials" / f"{number}.csv", lambda p: history.to_csv(p, index=False))
        score = float(history["val_precision_at_1"].iloc[-1])
        tracker.log_metrics({"val_precision_at_1": score, "trial_seconds": time.time() - started}, step=0)
        tracker.end(status="FINISHED")
        self.checkpoint(number).unlink(missing_ok=True)
        return score


def _write_outputs(study, params: dict, method: str, budget: int, folder: Path) -> None:
    """trials.csv and chosen.json (the best of the first ``budget`` trials; ties: the earliest)."""
    import optuna

    done = [t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
            if t.number < budget]
    rows = [{"trial": t.number, "first": t.user_attrs.get("source") == "first", **t.params,
             "val_precision_at_1": t.value} for t in done]
    table = pd.DataFrame(rows).sort_values("trial")
    io.write_with(folder / "trials.csv", lambda p: table.to_csv(p, index=False))
    best = max(done, key=lambda t: (t.value, -t.number))
    tuning = params["tuning"]
    io.write_json(folder / CHOSEN_FILE, {
        "values": best.params, "trial": best.number, "val_precision_at_1": best.value, "trials": budget,
        "first_trials": [{"trial": t.number, "values": t.params, "val_precision_at_1": t.value}
                         for t in done if t.user_attrs.get("source") == "first"],
        "objective": f"P@1 at the last epoch on {tuning['validation_classes']} held-out training classes (noisy "
                     "labels); the test split is never read",
        "sampler": tuning["sampler"], "seed": tuning["seed"], "optuna": optuna.__version__,
    })
