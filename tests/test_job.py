"""One training job built in one place: nothing outside the engine and the job builder constructs a Trainer, and a
run's params are merged one way for every stage that reads them (check, train, tune, timing, the studies)."""

from __future__ import annotations

import ast
import copy
from pathlib import Path

from conftest import REPO, repository_params

from noisydml.pipeline.job import check_run_params
from noisydml.runs import chain_run, chain_runs

SOURCES = [*sorted((REPO / "src").rglob("*.py")), *sorted((REPO / "scripts").rglob("*.py")),
           *sorted((REPO / "stages").rglob("*.py"))]
ALLOWED = {"src/noisydml/pipeline/job.py"}


def _constructs_trainer(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    return any(isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "Trainer"
               for node in ast.walk(tree))


def test_only_the_engine_and_the_job_builder_construct_a_trainer():
    offenders = [str(p.relative_to(REPO)) for p in SOURCES if _constructs_trainer(p)
                 and "src/noisydml/engine/" not in str(p.relative_to(REPO)) and str(p.relative_to(REPO)) not in ALLOWED]
    assert offenders == []
    assert _constructs_trainer(REPO / "src/noisydml/pipeline/job.py")  # the check sees a construction


def _with_nested_override():
    """Params with a chain whose override touches one key of a nested section (sgps's ``sgm``) and a timing entry
    doing the same: a shallow merge would drop the section's other keys."""
    params = copy.deepcopy(repository_params())
    key = next(k for k, c in params["chains"].items() if c["method"] == "sgps")
    params["chains"][key]["hparams"] = {"sgm": {"every_epochs": 3}, "margin": 0.25}
    params["timing"]["entries"] = {"t": {"label": "T", "method": "sgps", "hparams": {"sgm": {"every_epochs": 3}}}}
    return params, key


def test_check_train_tune_and_timing_read_a_runs_params_the_same_way():
    from noisydml.config import validate_params
    from noisydml.pipeline.timing import timing_run
    from noisydml.pipeline.tune import Subject

    raw, key = _with_nested_override()
    params = validate_params(raw)
    chain = params["chains"][key]
    trained = next(r for r in chain_runs(params) if r.chain["key"] == key).params(params)  # the train stage's
    checked = check_run_params(chain_run(key, chain, 0).params(params), "sgps", f"chains.{key}.hparams")  # check's
    tuning = {**params, "tuning": {**params["tuning"], "chains": [chain["name"]]}}
    tuned = Subject.of(tuning, chain["dataset"], chain["noise"], chain["name"]).params  # the tune stage's
    sgm = params["methods"]["sgps"]["sgm"]
    assert trained["methods"]["sgps"]["sgm"] == {**sgm, "every_epochs": 3}
    assert trained["methods"]["sgps"]["margin"] == 0.25
    assert checked == check_run_params(copy.deepcopy(trained), "sgps")
    assert tuned["methods"]["sgps"] == trained["methods"]["sgps"] and tuned["train"] == trained["train"]
    timed = timing_run(params, "t").params(params)  # the timing stage's
    assert timed["methods"]["sgps"]["sgm"] == {**sgm, "every_epochs": 3}
    assert timed["train"]["epochs"] == params["timing"]["epochs"] and timed["train"]["model_selection"] == "last"


def test_tuned_values_are_set_at_their_paths_over_the_runs_own_overrides():
    from noisydml.config import validate_params

    raw, key = _with_nested_override()
    params = validate_params(raw)
    run = chain_run(key, params["chains"][key], 0)
    tuned = run.params(params, {"sgm.every_epochs": 5, "train.optimizer.lr": 0.5})
    assert tuned["methods"]["sgps"]["sgm"]["every_epochs"] == 5 and tuned["methods"]["sgps"]["margin"] == 0.25
    assert tuned["train"]["optimizer"]["lr"] == 0.5
    assert params["train"]["optimizer"]["lr"] != 0.5  # a copy: the params are untouched
