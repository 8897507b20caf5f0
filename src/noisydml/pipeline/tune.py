"""The tune stages: one tuning study (dataset, noise, method or chained run) -> ``tuning/<dataset>/<noise>/<name>/``.

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
- **several seeds per trial** (``tuning.seeds``): a trial trains once per seed and is scored by the mean of their
  validation P@1 (each seed's score in ``trials.csv``), so one seed's luck does not choose the values; the budget,
  trials x seeds runs, is the same for every method. The held-out classes, the sampler and a chain's upstream runs
  keep ``tuning.seed``.
- **a chained run** (``tuning.chains``): its upstream runs (the grid method it starts from, then every chain before
  it) are trained once, untuned, on the same kept classes, into ``upstream/<run>/`` of the study's folder (ours:
  an upstream trained on all training classes would have seen the held-out ones, and SGPS's posterior clean starts
  from its upstream's weights); each trial then trains the chain's own step from the last of them. An upstream
  that selects its model on validation classes (``model_selection: best_validation``) selects on the held-out
  classes, the same for every trial (ours).

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
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from noisydml import io
from noisydml.engine.callbacks import code_fingerprint
from noisydml.pipeline.job import build_job, fit
from noisydml.pipeline.layout import EXPORTS, Layout
from noisydml.pipeline.pretrained import load_pretrained
from noisydml.pipeline.rundata import load_run_data
from noisydml.runtime import tracked_runtime
from noisydml.schema import ParamsError
from noisydml.tracking import MlflowTracker, mlflow_experiment, standard_tags
from noisydml.runs import CHOSEN_FILE, GRID, Run, chain_run, lineage, tuning_folder, tuning_name
from noisydml.tuning import first_trials, grid_trials

JOURNAL = "journal.log"
SETTINGS = "settings.json"


@dataclass(frozen=True)
class Subject:
    """What a study tunes: a method as the grid trains it, or a chained run's own step, trained after its
    upstream runs (its lineage, untuned) on the same split of the training classes."""

    name: str  # the method's name, or the chain's (chains.<key>.name)
    run: Run  # the untuned run it tunes: a grid run of the method, or the chained run (its overrides)
    params: dict  # params as the untuned run trains with them (run.params: a chain's overrides applied)
    root: str | None = None  # a chain: the grid method its lineage starts from
    steps: tuple = ()  # a chain: ((key, entry), ...) from the first chain after root to this chain (last)

    @property
    def method(self) -> str:
        """Whose space is searched: tuning.spaces.<method>."""
        return self.run.method

    @classmethod
    def of(cls, params: dict, dataset: str, noise: str, name: str) -> "Subject":
        if name not in params["tuning"]["chains"]:
            run = Run(GRID, tuning_name(dataset, noise, name), dataset, noise, name, params["tuning"]["seed"], name)
            return cls(name, run, run.params(params))
        root, steps = lineage(params["chains"], dataset, noise, name)
        run = chain_run(*steps[-1], params["tuning"]["seed"])
        return cls(name, run, run.params(params), root, tuple(steps))

    def methods(self) -> list[str]:
        """Every method a trial trains: the chain's upstream runs' too."""
        return [self.method] if not self.steps else [self.root, *(chain["method"] for _, chain in self.steps)]

    def settings(self, params: dict) -> dict:
        """Its part of the study's fingerprint: the method's params as trained; a chain's upstream runs too."""
        out = {"method": self.method, "hparams": self.params["methods"][self.method], "train": self.params["train"]}
        if self.steps:
            out["lineage"] = {"root": self.root, "root_hparams": params["methods"][self.root],
                              "chains": [{"key": key, **chain, "method_hparams": params["methods"][chain["method"]]}
                                         for key, chain in self.steps]}
        return out


def tune(params: dict, dataset: str, noise: str, name: str, layout: Layout = Layout()) -> Path:
    """Run (or resume) the tuning study of ``name`` -- a method of ``tuning.methods`` or a chained run of
    ``tuning.chains`` -- on ``dataset``/``noise``; write its outputs; return the folder."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    tuning = params["tuning"]
    subject = Subject.of(params, dataset, noise, name)
    space = tuning["spaces"][subject.method]
    folder = layout.root / tuning_folder(dataset, noise, name)
    data = load_run_data(dataset, noise, layout, tuning["validation_classes"], tuning["seed"])
    trainer = _TrialTrainer(params, dataset, noise, subject, data, layout)
    _start_afresh_unless_same(folder, _settings(params, subject, data.fingerprint, trainer.pretrained,
                                                optuna.__version__))
    upstream = trainer.train_lineage(folder)
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(folder / JOURNAL)))
    label = tuning_name(dataset, noise, name)
    study = optuna.create_study(study_name=label, storage=storage, direction="maximize", load_if_exists=True)
    grid = grid_trials(space) if tuning["sampler"]["name"] == "grid" else None
    if not study.trials:
        for values in grid or first_trials(subject.params, subject.method, space):
            study.enqueue_trial(values, user_attrs={"source": "grid" if grid else "first"})
    distributions = {key: _distribution(optuna, e) for key, e in space.items()}
    budget = len(grid) if grid else tuning["trials"]
    while True:
        trials = study.get_trials(deepcopy=False)
        killed = [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
        if killed:  # a trial killed mid-training: its values are stored; train it on from its checkpoint
            trial_number, values = killed[0].number, killed[0].params
        elif sum(t.state == optuna.trial.TrialState.COMPLETE for t in trials) >= budget:
            break
        else:  # trial k from a sampler seeded seed + k: the same trial whether or not the study was killed
            number = len(trials)
            asking = optuna.load_study(study_name=label, storage=storage,
                                       sampler=_sampler(optuna, tuning, tuning["seed"] + number))
            trial = asking.ask(distributions)
            trial_number, values = trial.number, trial.params
        print(f"tune {label}: trial {trial_number + 1}/{budget} {_short(values)}", flush=True)
        score, per_seed = trainer.score(trial_number, values, folder, upstream)
        study.tell(trial_number, score)
        seeds = ", ".join(f"seed {k} {v:.4f}" for k, v in per_seed.items())
        print(f"tune {label}: trial {trial_number + 1}/{budget} validation P@1 {score:.4f}"
              + (f" (mean of {seeds})" if len(per_seed) > 1 else ""), flush=True)
    _write_outputs(study, subject, budget, folder)
    return folder


def _settings(params: dict, subject: Subject, data_fingerprint: str, pretrained: dict, optuna_version: str) -> dict:
    """What every trial's result depends on, but the budget (raising it keeps the trials run)."""
    tuning = {k: v for k, v in params["tuning"].items()
              if k not in ("trials", "datasets", "noises", "methods", "chains")}
    tuning["spaces"] = {subject.method: params["tuning"]["spaces"][subject.method]}
    return {**subject.settings(params), "tuning": tuning,
            "evaluate": {"device": params["evaluate"]["device"]}, "data": data_fingerprint,
            "pretrained": pretrained, "runtime": tracked_runtime(params["runtime"]), "optuna": optuna_version,
            "code": code_fingerprint(__name__, *(f"noisydml.methods.{m}" for m in subject.methods()))}


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
    """Trains on the training classes kept and scores on the held-out ones: a chain's upstream runs once
    (:meth:`train_lineage`), then each trial (:meth:`score`). The trainer is never handed the test split."""

    def __init__(self, params: dict, dataset: str, noise: str, subject: Subject, data, layout: Layout):
        self.params, self.dataset, self.noise, self.subject = params, dataset, noise, subject
        self.data, self.layout = data, layout
        kept, wanted = len(set(data.train_set.labels.tolist())), params["train"]["batch"]["classes"]
        if kept < wanted:
            held = params["tuning"]["validation_classes"]
            raise ParamsError(f"tuning.validation_classes: {held} held out of {dataset}/{noise}'s training labels "
                              f"leaves {kept} classes to train on, fewer than train.batch.classes ({wanted}); allowed: "
                              f"at most {kept + held - wanted}")
        self.backbone_state, self.pretrained = load_pretrained(params, layout)
        self.label = tuning_name(dataset, noise, subject.name)

    def checkpoint(self, part: str) -> Path:
        return (self.layout.root / ".checkpoints" / tuning_folder(self.dataset, self.noise, self.subject.name) / part
                / "last.pt")

    def train_lineage(self, folder: Path) -> Path | None:
        """A chain's upstream runs, untuned, each from the one before (the first from its grid method), on this
        split: into ``folder/upstream/<run>/`` (``model.pt``, ``exports.npz``), once per study (the folder persists;
        a run killed mid-training resumes from its checkpoint). The last one's folder; None for a method."""
        if not self.subject.steps:
            return None
        runs = [(self.subject.root, self.params, None)]
        runs += [(chain["name"], chain_run(key, chain, 0).params(self.params), chain)
                 for key, chain in self.subject.steps[:-1]]
        previous = None
        for name, params, chain in runs:
            out = folder / "upstream" / name
            if not (out / "model.pt").is_file():
                print(f"tune {self.label}: training the upstream run {name} on the tuning split", flush=True)
                method = chain["method"] if chain else name
                result, data, _ = self._fit(params, method, f"upstream/{name}", f"{name} · {self.noise} · upstream of "
                                         f"{self.subject.name}", chain, previous)
                with io.atomic_dir(out) as tmp:
                    torch.save({"model": result.model.state_dict(), "method": result.method.state_dict(),
                                "train": params["train"], "method_name": method}, tmp / "model.pt")
                    if result.exports:
                        np.savez(tmp / EXPORTS, sample_id=data.sample_ids, **result.exports)
                self.checkpoint(f"upstream/{name}").unlink(missing_ok=True)
            previous = out
        return previous

    def score(self, number: int, values: dict, folder: Path, upstream: Path | None) -> tuple[float, dict[int, float]]:
        """Trial ``number``: the subject with ``values``, trained (after ``upstream``, for a chain) once per seed of
        ``tuning.seeds`` and scored by the mean of their validation P@1; also each seed's score. A seed already
        scored (``trials/<k>.seed<s>.csv``: a study killed between seeds) is read back, not retrained."""
        seeds = self.params["tuning"]["seeds"]
        histories, scores = [], {}
        for seed in seeds:
            done = folder / "trials" / f"{number}.seed{seed}.csv"
            if not done.is_file():
                history = self._score_seed(number, seed, values, upstream)
                io.write_with(done, lambda p, h=history: h.to_csv(p, index=False))
            history = pd.read_csv(done)
            scores[seed] = float(history["val_precision_at_1"].iloc[-1])
            histories.append(history.assign(seed=seed))
        table = pd.concat(histories, ignore_index=True)
        io.write_with(folder / "trials" / f"{number}.csv", lambda p: table.to_csv(p, index=False))
        for seed in seeds:
            (folder / "trials" / f"{number}.seed{seed}.csv").unlink()
        return float(np.mean([scores[s] for s in seeds])), scores

    def _score_seed(self, number: int, seed: int, values: dict, upstream: Path | None) -> pd.DataFrame:
        """One seed of trial ``number``: its epochs (validation P@1 as ``val_precision_at_1``)."""
        subject = self.subject
        params = subject.run.params(self.params, values)
        started = time.time()
        part = f"trial{number}" if seed == self.params["tuning"]["seed"] else f"trial{number}-seed{seed}"
        result, _, tracker = self._fit(params, subject.method, part, f"{subject.name} · {self.noise} · trial "
                                       f"{number} · seed {seed}", subject.steps[-1][1] if subject.steps else None,
                                       upstream, trial=number, values=values, seed=seed)
        history = pd.DataFrame(result.history).rename(columns=lambda c: c.replace("test_", "val_", 1))
        tracker.log_metrics({"val_precision_at_1": float(history["val_precision_at_1"].iloc[-1]),
                             "trial_seconds": time.time() - started}, step=0)
        tracker.end(status="FINISHED")
        self.checkpoint(part).unlink(missing_ok=True)
        return history

    def _fit(self, params: dict, method: str, part: str, run_name: str, chain: dict | None, upstream: Path | None,
             trial: int | None = None, values: dict | None = None, seed: int | None = None):
        """Train ``method`` with ``params`` on the kept classes (from ``upstream`` for a chain), the held-out classes
        in the test set's place; a trial scores its last epoch, an upstream run keeps its own model selection."""
        params = {**params, "train": {**params["train"], "validation_classes": self.params["tuning"]
                                      ["validation_classes"]}}
        if trial is not None:  # ours: the last epoch is scored (as the runs report the last epoch)
            params["train"]["model_selection"] = "last"

        def tracking_run(spec, hparams):
            return MlflowTracker(
                f"{mlflow_experiment(params, self.dataset)}-tuning", run_name,
                params={"dataset": self.dataset, "noise": self.noise, "method": method, "tuned": self.subject.name,
                        **({"trial": trial, "values": values, "seed": seed} if trial is not None
                           else {"upstream_of": self.subject.name}),
                        "method_hparams": hparams, "train": params["train"]},
                tags={"dvc_stage": f"{'tune_chain' if self.subject.steps else 'tune'}@{self.label}",
                      "dataset": self.dataset, "noise": self.noise, "method": method,
                      **({"trial": str(trial)} if trial is not None else {"part": part}),
                      "run_fingerprint": spec.fingerprint(), **standard_tags(self.layout.root)},
                root=self.layout.root)

        seed = params["tuning"]["seed"] if seed is None else seed
        built = build_job(params, method, seed, self.data, self.layout, self.checkpoint(part),
                          tracker=tracking_run, code=(__name__,), where=f"tune {self.label}: {run_name}", chain=chain,
                          upstream_dir=upstream, pretrained=(self.backbone_state, self.pretrained),
                          held_out_as_test=True)
        # the test seam stops in trial NOISYDML_STOP_IN_TRIAL only, where that is set (tests)
        in_trial = os.environ.get("NOISYDML_STOP_IN_TRIAL")
        result = fit(built.job, stoppable=in_trial is None or (trial is not None and int(in_trial) == trial))
        if trial is None:
            built.job.tracker.end(status="FINISHED")
        return result, built.data, built.job.tracker


def _seed_scores(folder: Path, number: int) -> dict[str, float]:
    """Trial ``number``'s validation P@1 per seed (its last epoch of each), from ``trials/<k>.csv``."""
    table = pd.read_csv(folder / "trials" / f"{number}.csv")
    return {f"val_precision_at_1_seed{seed}": float(group["val_precision_at_1"].iloc[-1])
            for seed, group in table.groupby("seed", sort=False)}


def _write_outputs(study, subject: Subject, budget: int, folder: Path) -> None:
    """trials.csv and chosen.json (the best of the first ``budget`` trials; ties: the earliest)."""
    import optuna

    done = [t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
            if t.number < budget]
    rows = [{"trial": t.number, "first": t.user_attrs.get("source") == "first", **t.params,
             "val_precision_at_1": t.value, **_seed_scores(folder, t.number)} for t in done]
    table = pd.DataFrame(rows).sort_values("trial")
    io.write_with(folder / "trials.csv", lambda p: table.to_csv(p, index=False))
    best = max(done, key=lambda t: (t.value, -t.number))
    tuning = subject.params["tuning"]
    io.write_json(folder / CHOSEN_FILE, {
        "values": best.params, "trial": best.number, "val_precision_at_1": best.value, "trials": budget,
        "first_trials": [{"trial": t.number, "values": t.params, "val_precision_at_1": t.value}
                         for t in done if t.user_attrs.get("source") == "first"],
        "objective": f"P@1 at the last epoch on {tuning['validation_classes']} held-out training classes (noisy "
                     f"labels), the mean over the trial's seeds {tuning['seeds']}; the test split is never read",
        **({"upstream": f"{' -> '.join([subject.root, *(c['name'] for _, c in subject.steps[:-1])])}, untuned, "
                        "trained once on the same split"} if subject.steps else {}),
        "seeds": tuning["seeds"], "seed_scores": _seed_scores(folder, best.number),
        "budget_runs": budget * len(tuning["seeds"]),
        "sampler": tuning["sampler"], "seed": tuning["seed"], "validation_classes": tuning["validation_classes"],
        "optuna": optuna.__version__,
    })
