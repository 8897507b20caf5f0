"""CI's reproduction guard (noisydml.tools.guard): bit-identity on the host that made the committed results,
the measured tolerance elsewhere; a changed loss fails it, a host-level float difference does not.

The real cases are metrics files of the default grid (tests/data/guard/, made by scripts/simulate_hosts.py and
README "Reproducibility"), all of one commit of this work: its results under portable numerics (``committed``),
the same commit on this machine with native numerics and the results committed at 7a1bd78 on another machine
(float differences of the kind the tolerance is derived from), and the same commit with a deliberately changed
loss.
"""

import json
import subprocess
import sys

import pytest
import yaml

from conftest import REPO
from noisydml.tools.guard import compare, is_data, load_tolerance, verdict, violations

DATA = REPO / "tests" / "data" / "guard"
TOLERANCE = load_tolerance(REPO / ".ci" / "tolerance.yaml")


def _case(name: str) -> dict:
    """A guard test case: metrics, host record and per-stage lock digests (scripts/simulate_hosts.py fixture)."""
    return json.loads((DATA / f"{name}.json").read_text())


def _as_regenerated(case: dict, committed: dict, same_host: bool) -> tuple[dict, dict]:
    """The committed case and ``case`` in the shape :func:`verdict` takes (lock digests as one-stage locks)."""
    def shaped(c, host):
        lock = {"stages": {name: {"cmd": d["inputs"], "outs": [{"path": name, "md5": d["outputs"]}]}
                           for name, d in (c["stages"] or committed["stages"]).items()}}
        return {"metrics": c["metrics"], "host": host, "lock": lock}
    host = dict(committed["host"]) if same_host else {**committed["host"], "id": "another-host"}
    return shaped(committed, committed["host"]), shaped(case, host)


def test_identical_metrics_pass_on_either_host():
    m = {"glyphs/clean/ms": {"precision_at_1": 0.5, "recall_at_2": 0.7}}
    for same_host in (True, False):
        assert violations(compare(m, json.loads(json.dumps(m))), same_host, TOLERANCE) == []


def test_any_difference_fails_on_the_host_that_made_the_results():
    old = {"glyphs/clean/ms": {"precision_at_1": 0.5}}
    new = {"glyphs/clean/ms": {"precision_at_1": 0.5000001}}
    assert violations(compare(old, new), same_host=True, tolerance=TOLERANCE)
    assert violations(compare(old, new), same_host=False, tolerance=TOLERANCE) == []


def test_missing_or_extra_runs_and_metrics_fail_everywhere():
    old = {"glyphs/clean/ms": {"precision_at_1": 0.5}, "glyphs/clean/mcl": {"precision_at_1": 0.4}}
    new = {"glyphs/clean/ms": {"precision_at_1": 0.5, "nmi": 0.7}}
    for same_host in (True, False):
        found = violations(compare(old, new), same_host, TOLERANCE)
        assert any("committed but not regenerated: glyphs/clean/mcl" in v for v in found)
        assert any("regenerated but not committed: glyphs/clean/ms: nmi" in v for v in found)


def test_one_metric_beyond_its_kind_maximum_fails_elsewhere():
    limit = TOLERANCE["precision_at_1"]["max_points"]
    runs = {f"glyphs/clean/m{i}": {"precision_at_1": 0.5} for i in range(40)}
    moved = json.loads(json.dumps(runs))
    moved["glyphs/clean/m0"]["precision_at_1"] = 0.5 + (limit + 0.1) / 100
    found = violations(compare(runs, moved), same_host=False, tolerance=TOLERANCE)
    assert len(found) == 1 and "glyphs/clean/m0: precision_at_1" in found[0]
    moved["glyphs/clean/m0"]["precision_at_1"] = 0.5 + (limit - 0.1) / 100
    assert violations(compare(runs, moved), same_host=False, tolerance=TOLERANCE) == []


def test_many_metrics_moving_within_the_maximum_fail_on_their_mean():
    mean = TOLERANCE["precision_at_1"]["mean_points"]
    runs = {f"glyphs/clean/m{i}": {"precision_at_1": 0.5} for i in range(40)}
    shifted = {k: {"precision_at_1": 0.5 + (mean + 0.2) / 100} for k in runs}
    found = violations(compare(runs, shifted), same_host=False, tolerance=TOLERANCE)
    assert found and all("mean |difference|" in v for v in found)


def test_a_kind_without_a_tolerance_fails():
    found = violations(compare({"r": {"new_metric": 0.1}}, {"r": {"new_metric": 0.2}}), False, TOLERANCE)
    assert found == ["new_metric: no tolerance in .ci/tolerance.yaml (add one, derived from measurement)"]


def test_every_metric_kind_of_the_committed_results_has_a_tolerance():
    committed = json.loads((REPO / "reports" / "all_metrics.json").read_text())
    # the cases are runs of today's grid (which has grown since they were made: MS at rho = 1 joined the default
    # grid after them; every metric kind of it is one the cases and the tolerance cover)
    assert set(_case("committed")["metrics"]) <= set(committed), "the guard's cases are runs of today's grid"
    kinds = set(compare(committed, committed).by_kind())
    assert kinds <= set(TOLERANCE), kinds - set(TOLERANCE)


@pytest.mark.parametrize("host", sorted(p.stem for p in DATA.glob("host_*.json")))
def test_the_default_grid_on_another_host_passes_there_and_fails_where_the_results_were_made(host):
    """The same code and params on another (simulated, or the previous) host: a host-level float difference."""
    committed, case = _case("committed"), _case(host)
    c = compare(committed["metrics"], case["metrics"])
    assert c.changed, "a host-level difference should change metrics (else this case tests nothing)"
    failures, _, same_host, _ = verdict(*_as_regenerated(case, committed, same_host=False), TOLERANCE)
    assert not same_host and failures == []
    failures, _, same_host, _ = verdict(*_as_regenerated(case, committed, same_host=True), TOLERANCE)
    assert same_host and failures


def test_the_default_grid_with_a_changed_loss_fails_on_any_host():
    """The committed results, then ms.py changed (the multi-similarity loss without its pair miner, README
    "Reproducibility") and the pipeline regenerated: the results committed before the change are stale."""
    committed, case = _case("committed"), _case("changed_loss")
    for same_host in (True, False):
        failures, c, _, outputs = verdict(*_as_regenerated(case, committed, same_host), TOLERANCE)
        assert failures and "stale for 4 stage(s)" in failures[0]
        for stage in ("train@glyphs-clean-ms-0", "train@glyphs-sym50-ms-0", "train@glyphs-sc50-ms-0",
                      "train_chain@ms_on_prism_kept"):
            assert stage in failures[0]
        assert outputs == (36, 42) and len(c.changed) == 39


def _git(root, *args):
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"})


def _guard(root, summary=None):
    cmd = [sys.executable, "-m", "noisydml.tools.guard", "--skip-pipeline-state",
           "--tolerance", str(REPO / ".ci" / "tolerance.yaml")] + (["--summary", str(summary)] if summary else [])
    return subprocess.run(cmd, cwd=root, capture_output=True, text=True)


def test_the_command_compares_with_the_committed_files_and_says_which_case(tmp_path):
    """The CLI reads the committed metrics and host record from git (HEAD), the regenerated ones from the work
    tree, and exits 1 on a failure; the verdict goes to stdout and to --summary."""
    (tmp_path / "reports").mkdir()
    host = {"id": "aaaa", "cpu": {"model": "x", "isa": ["avx2"]}, "numerics": "portable", "threads": 2}
    metrics = {"glyphs/clean/ms": {"precision_at_1": 0.5}}
    (tmp_path / "reports" / "host.json").write_text(json.dumps(host))
    (tmp_path / "reports" / "all_metrics.json").write_text(json.dumps(metrics))
    (tmp_path / "dvc.lock").write_text(yaml.safe_dump({"stages": {"report": {"outs": [{"path": "r", "md5": "1"}]}}}))
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "results")
    ok = _guard(tmp_path, tmp_path / "summary.md")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "made the committed results: bit-identical metrics required" in ok.stdout
    assert "metrics bit-identical: 1 of 1" in ok.stdout and "**PASS**" in (tmp_path / "summary.md").read_text()
    # the same host, one metric moved: a failure
    (tmp_path / "reports" / "all_metrics.json").write_text(json.dumps({"glyphs/clean/ms": {"precision_at_1": 0.51}}))
    changed = _guard(tmp_path)
    assert changed.returncode == 1 and "**FAIL**" in changed.stdout
    # another host: the same move is within the tolerance
    (tmp_path / "reports" / "host.json").write_text(json.dumps({**host, "id": "bbbb"}))
    elsewhere = _guard(tmp_path)
    assert elsewhere.returncode == 0, elsewhere.stdout
    assert "made on host `aaaa`, this is `bbbb`" in elsewhere.stdout


def test_entries_of_stages_the_pipeline_no_longer_has_do_not_make_code_look_like_data():
    """A lock keeps the entries of removed stages: their outputs must not turn another stage's code into data
    (seen: a regenerated lock with old entries called the report stage stale)."""
    from noisydml.tools.guard import stage_digests, stale_stages

    report = {"cmd": "python stages/report.py", "deps": [{"path": "src/noisydml/reporting", "md5": "a.dir"}],
              "outs": [{"path": "reports/all_metrics.json", "md5": "m"}]}
    with_old = {"stages": {"report": report, "gone": {"cmd": "x", "outs": [{"path": "src", "md5": "s.dir"}]}}}
    current = {"stages": {"report": report}}
    assert stale_stages(stage_digests(current, {"report"}), stage_digests(with_old, {"report"})) == []
    changed = {"stages": {"report": {**report, "deps": [{"path": "src/noisydml/reporting", "md5": "b.dir"}]}}}
    assert stale_stages(stage_digests(current, {"report"}), stage_digests(changed, {"report"})) == ["report"]


def test_ci_regenerates_when_an_input_differs_from_the_lock_and_not_for_what_a_clean_clone_lacks():
    """scripts/grid_inputs_changed.py on `dvc status --json` as a clean clone of this repository prints it: missing
    outputs, and dependencies that are (or hold) stages' outputs, are no change; a params value, a source file, a
    committed output that differs from the lock, a stage the lock lacks are."""
    from conftest import load_script

    script = load_script("grid_inputs_changed")
    outputs = ["data/raw/glyphs", "data/prepared/glyphs", "runs/glyphs/clean/ms/seed0", "metrics/glyphs/clean/ms",
               "reports/results.md"]
    clean_clone = {
        "download@glyphs": [{"changed outs": {"data/raw/glyphs": "deleted"}}],
        "prepare@glyphs": [{"changed deps": {"data/raw/glyphs": "deleted"}},
                           {"changed outs": {"data/prepared/glyphs": "not in cache"}}],
        "evaluate@glyphs": [{"changed deps": {"runs/glyphs": "modified"}}],  # holds outputs, some committed
    }
    assert script.changed_inputs(clean_clone, outputs) == []
    changed = {
        **clean_clone,
        "train@glyphs-clean-ms-0": [{"changed deps": {"src/noisydml/engine/trainer.py": "modified",
                                                      "params.yaml": {"train.epochs": "modified"}}}],
        "report": [{"changed outs": {"reports/results.md": "modified"}}],
        "train@glyphs-clean-new-0": ["always changed"],
    }
    assert script.changed_inputs(changed, outputs) == [
        "train@glyphs-clean-ms-0: changed deps src/noisydml/engine/trainer.py modified",
        "train@glyphs-clean-ms-0: changed deps params.yaml:train.epochs modified",
        "report: changed outs reports/results.md modified",
        "train@glyphs-clean-new-0: always changed"]
    assert is_data("runs/glyphs", outputs) and is_data("runs/glyphs/clean/ms/seed0/model.pt", outputs)
    assert not is_data("runs/glyph", outputs)
