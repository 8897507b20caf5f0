"""A tiny end-to-end pipeline in a temporary git + DVC repository.

Checks what a user relies on: the grid runs to a report, a second `dvc repro`
does nothing, changing one noise rate dirties only what depends on it, and
MLflow holds one finished run per trained model.

Why this module is slow (minutes on 2 cores): every DVC stage is a process
that imports torch, MLflow and faiss (seconds each), whatever the size of its
work. The module builds one repository, whose grid has one stage of every kind
(download, prepare, pretrain, corrupt, corrupt_from_run, train,
train_on_run_noise, train_chain, train_embedding_size, train_bspml_cell,
timing, evaluate, report), and shares it between its tests; a test that
re-runs stages re-runs only those its check needs, through DVC itself (`dvc
exp run -S`, `dvc repro`). The repository is built by the launcher (README
"Many runs at once": the stages' own commands, one warm process, recorded in
dvc.lock as `dvc repro` records them), which tests/test_launch.py compares
with a serial `dvc repro` bit for bit; DVC is then the judge here (`dvc status`
clean, a second `dvc repro` runs nothing, CI's guard passes). The suite's
`dvc repro` from scratch is test_e2e_sgps.py's, which runs beside this module
on the other worker, with a chain killed and resumed through DVC and `dvc exp
run -S train.optimizer.lr=3e-05`.
"""
import json
import subprocess
import sys

import pandas as pd
import pytest
import yaml

from conftest import REPO, dvc_repo, run_command, tiny_params

pytestmark = pytest.mark.e2e

NOISES = ("clean", "sym50", "sc25", "scrun")  # grid.noises, then grid.run_noises


_run = run_command


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    with open(REPO / "params.yaml") as f:
        raw = tiny_params(yaml.safe_load(f))
    raw["grid"].update(noises=["clean", "sym50", "sc25"], methods=["ms", "prism"], seeds=[0], run_noises=["scrun"])
    # small-cluster noise clustered on the clean ms run's embeddings: a DVC edge from that run
    raw["noise"]["scrun"] = {"kind": "small_cluster", "rate": 0.25, "seed": 0, "features": {"source": "run"}}
    raw["noise_runs"] = {"glyphs-scrun": {"dataset": "glyphs", "noise": "scrun",
                                          "run": {"noise": "clean", "method": "ms", "seed": 0}}}
    raw["methods"]["prism"]["memory_size"] = 64
    raw["figures"]["bspml_maps"] = {}  # no bspml run here (the default pipeline in CI draws its map)
    # one point of BSPML's Fig. 5 (Recall@1 against the embedding size): ms with an 8-d embedding on sc25
    raw["figures"]["embedding_size"] = {"dataset": "glyphs", "noise": "sc25", "methods": ["ms"], "dims": [8],
                                        "seeds": [0]}
    # one cell of BSPML's Figs. 3-4 retrained per cell: lambda written as a float (3.0), mu as an int (20), the two
    # ways DVC writes a number in a stage name and a path
    raw["figures"]["bspml_cells"] = {"dataset": "glyphs", "noise": "sc25", "lambdas": [3.0], "mus": [20],
                                     "seeds": [0]}
    # every run starts from the embedded pretrained backbone (a tiny pretraining)
    raw["train"]["pretrained"] = "embedded"
    raw["pretrain"].update(classes=8, images_per_class=6, image_size=16, epochs=1, batch_size=16)
    # model selection on held-out training classes, with the (opt-in) timing stage on
    raw["train"].update(validation_classes=2, model_selection="best_validation", batch={"classes": 2, "per_class": 2})
    raw["methods"]["prism"].update(warmup_steps=0, memory_warmup_steps=0)  # selection from the first step
    raw["chains"] = {"ms_on_prism_kept": {"name": "ms_on_prism_kept", "dataset": "glyphs", "noise": "sym50", "seeds": "grid",
                                          "method": "ms", "upstream": "prism", "init": {"model": True, "method": False},
                                          "labels": {"label": "", "keep": "keep"}, "inputs": []}}
    # the timing stages train on sc25's labels: changing sym50's rate (a test below) leaves them alone
    raw["timing"]["noise"] = "sc25"
    raw["timing"]["entries"] = {"prism_eq3": {"label": "PRISM without centres", "method": "prism",
                                              "hparams": {"centres": False}}}
    env, _ = dvc_repo(root, raw, repro=False)
    # two stages at once, as a user launches (README "Many runs at once"): the first two training stages open the new
    # MLflow store together (test_mlflow_has_one_finished_run_per_model counts every run)
    out = _run([sys.executable, "-m", "noisydml.tools.launch", "-j", "2"], root, env)
    return root, env, out


def test_repro_produces_report_and_metrics(repo):
    root, env, out = repo
    for name in ("results.md", "results.csv", "noise_stats.csv", "figures/p_at_1_vs_noise.png",
                 "figures/noise_per_class.png", "all_metrics.json", "training_time.csv", "selection.csv",
                 "figures/selection_over_training.png", "results.tex", "pdf/p_at_1_vs_noise.pdf",
                 "pdf/selection_over_training.pdf", "orderings.csv"):
        assert (root / "reports" / name).is_file(), name
    table = (root / "reports" / "results.md").read_text()
    assert "| MS |" in table and "50% symmetric P@1" in table and "25% small-cluster MAP@R" in table
    assert "sym50" not in table.split("\n## ", 1)[0]  # the main table names settings as the papers do
    metrics = json.loads((root / "reports" / "all_metrics.json").read_text())
    assert set(metrics) == {f"glyphs/{n}/{m}" for n in NOISES for m in ("ms", "prism")} | {
        "glyphs/sym50/ms_on_prism_kept", "glyphs/sc25/ms_dim8", "glyphs/sc25/bspml_lam3.0_mu20"}
    chained = next(line for line in table.splitlines() if line.startswith("| MS on PRISM's kept samples |"))
    assert "Chained runs" in table and "–" in chained  # the chain runs on sym50 only
    headline = json.loads((root / "reports" / "metrics" / "glyphs" / "clean" / "ms.json").read_text())
    assert set(headline) == {"P@1", "MAP@R"}
    assert 0 <= metrics["glyphs/clean/ms"]["precision_at_1"] <= 1
    shown = _run([sys.executable, "-m", "dvc", "metrics", "show", "--json"], root, env)
    assert "glyphs/clean/ms" in shown
    # every figure the pipeline draws is a DVC plot, and DVC loads them all
    plots = json.loads(_run([sys.executable, "-m", "dvc", "plots", "show", "--json"], root, env))
    assert not plots.get("errors")
    drawn = {str(p.relative_to(root)) for p in (root / "reports").rglob("*.png")}
    assert drawn <= set(plots["data"] if "data" in plots else plots), drawn - set(plots.get("data", plots))


def test_embedding_size_point_trains_its_dim_and_has_its_own_report_section(repo):
    """BSPML Fig. 5's runs: train.embedding_dim set per point, evaluated like any run, kept out of the grid table."""
    root, env, _ = repo
    run = root / "runs" / "glyphs" / "sc25" / "ms_dim8" / "seed0"
    import numpy as np
    import torch

    assert np.load(run / "test_embeddings.npz")["embeddings"].shape[1] == 8
    assert torch.load(run / "model.pt", weights_only=False)["train"]["embedding_dim"] == 8
    report = (root / "reports" / "results.md").read_text()
    grid_table = report.split("\n## ", 1)[0]
    assert "ms_dim8" not in grid_table
    section = report.split("## Embedding size (BSPML Fig. 5)", 1)[1].split("\n## ", 1)[0]
    assert "| method | d = 8 |" in section and "| ms | " in section
    sizes = pd.read_csv(root / "reports" / "studies" / "bspml" / "embedding_size.csv")
    assert sizes[["method", "embedding_dim", "seeds"]].values.tolist() == [["ms", 8, 1]]
    assert (root / "reports" / "figures" / "bspml-embedding_size.png").is_file()
    dot = _run([sys.executable, "-m", "dvc", "dag", "--dot", "train_embedding_size@ms-8-0"], root, env)
    assert '"corrupt@glyphs-sc25" -> "train_embedding_size@ms-8-0"' in dot


def test_bspml_cells_hold_the_age_and_have_their_own_report_section(repo):
    """BSPML Figs. 3-4 retrained per cell: lambda_0 = lambda_inf = lambda, c = 1, mu per cell; MAW/SDAW/R@1 map."""
    root, env, _ = repo
    import torch

    run = root / "runs" / "glyphs" / "sc25" / "bspml_lam3.0_mu20" / "seed0"
    history = pd.read_csv(run / "history.csv")
    assert (history["bspml_lambda"] == 3.0).all()  # the age never moves
    saved = torch.load(run / "model.pt", weights_only=False)
    assert saved["method_name"] == "bspml"
    cells = pd.read_csv(root / "reports" / "studies" / "bspml" / "bspml_cells.csv")
    assert cells[["lambda", "mu", "seeds"]].values.tolist() == [[3.0, 20.0, 1]]
    assert cells["maw"].between(0, 1).all() and cells["sdaw"].ge(0).all() and cells["recall_at_1"].between(0, 1).all()
    report = (root / "reports" / "results.md").read_text()
    assert "bspml_lam" not in report.split("\n## ", 1)[0]
    section = report.split("## BSPML retrained per cell (Figs. 3-4)", 1)[1].split("\n## ", 1)[0]
    assert "| 3 | 20 | " in section
    assert (root / "reports" / "figures" / "bspml-bspml_cells.png").is_file()
    ran = _run([sys.executable, "-m", "dvc", "stage", "list", "--name-only"], root, env).split()
    assert "train_bspml_cell@3.0-20-0" in ran


def test_runs_start_from_the_pretrain_stage_weights(repo):
    root, env, _ = repo
    dot = _run([sys.executable, "-m", "dvc", "dag", "--dot", "train@glyphs-clean-ms-0"], root, env)
    assert '"pretrain" -> "train@glyphs-clean-ms-0"' in dot
    card = json.loads((root / "data" / "pretrained" / "card.json").read_text())
    assert card["trained_here"] and card["source_classes"] == 8 and len(card["source_characters"]) == 8
    info = json.loads((root / "runs" / "glyphs" / "clean" / "ms" / "seed0" / "run.json").read_text())
    assert info["pretrained"] == {"source": "embedded", "sha256": card["weights_sha256"]}


def test_dvc_plots_render_one_line_per_method(repo):
    root, env, _ = repo
    html = root.parent / "plots_out"
    _run([sys.executable, "-m", "dvc", "plots", "show", "-o", str(html)], root, env)
    page = (html / "index.html").read_text()
    assert '"color": {"field": "method", "type": "nominal", "scale": {"scheme": "tableau20"}' in page
    assert '"column": {"field": "noise_kind", "type": "nominal"' in page  # one panel per noise kind
    # the report figure's points: each run under its label (the papers' naming), its id beside it
    assert '"noise": "sym50"' in page and '"run": "ms"' in page and '"method": "MS"' in page


def test_second_repro_does_nothing_and_the_ci_guard_passes(repo):
    root, env, _ = repo
    status = subprocess.run([sys.executable, "-m", "dvc", "status", "-q"], cwd=root, env=env)
    assert status.returncode == 0, "dvc status reports changes right after dvc repro"
    out = _run([sys.executable, "-m", "dvc", "repro"], root, env)
    assert "Running stage" not in out
    # committed as a user commits results; CI's guard (dvc status, dvc repro --dry, metrics against HEAD's) passes:
    # this host made them, so they are compared bit for bit
    _run(["git", "add", "-A"], root, env)
    _run(["git", "commit", "-qm", "results"], root, env)
    verdict = _run([sys.executable, "-m", "noisydml.tools.guard", "--tolerance", str(REPO / ".ci" / "tolerance.yaml")],
                   root, env)
    assert "made the committed results: bit-identical metrics required" in verdict and "**PASS**" in verdict


def test_mlflow_has_one_finished_run_per_model(repo):
    root, env, _ = repo
    code = (
        "import mlflow, json;"
        f"mlflow.set_tracking_uri('sqlite:///{root / 'mlflow.db'}');"
        "runs = mlflow.search_runs(experiment_names=['noisydml-glyphs']);"
        "print(json.dumps(sorted(zip(runs['tags.mlflow.runName'], runs['status'], runs['metrics.final_precision_at_1'].notna(),"
        " runs['tags.mlflow.source.git.commit'].notna(), runs['tags.run'], runs['params.runtime.threads'].notna()))))"
    )
    runs = json.loads(_run([sys.executable, "-c", code], root, env).strip().splitlines()[-1])
    assert len(runs) == len([p for p in (root / "runs").glob("*/*/*/seed*") if p.is_dir()])  # every training run
    assert runs == sorted([[f"{m} · {n} · seed 0", "FINISHED", True, True, m, True] for n in NOISES for m in ("ms", "prism")]
                          + [[f"{m} · {n} · seed 0", "FINISHED", True, True, m, True] for n, m in (
                              ("sym50", "ms_on_prism_kept"), ("sc25", "ms_dim8"), ("sc25", "bspml_lam3.0_mu20"))])


def test_a_chained_run_names_its_upstream_mlflow_run(repo):
    root, env, _ = repo
    code = (
        "import mlflow, json;"
        f"mlflow.set_tracking_uri('sqlite:///{root / 'mlflow.db'}');"
        "runs = mlflow.search_runs(experiment_names=['noisydml-glyphs']);"
        "print(json.dumps(dict(zip(runs['tags.mlflow.runName'], runs['tags.upstream_mlflow_run_id'].fillna('')))));"
        "print(json.dumps(dict(zip(runs['tags.mlflow.runName'], runs['run_id']))))"
    )
    upstreams, ids = (json.loads(line) for line in _run([sys.executable, "-c", code], root, env).strip().splitlines()[-2:])
    assert upstreams["ms_on_prism_kept · sym50 · seed 0"] == ids["prism · sym50 · seed 0"]
    assert upstreams["prism · sym50 · seed 0"] == ""


def test_a_re_cloned_repository_opens_its_mlflow_artifacts(repo, tmp_path):
    """git clone of the repository, with its MLflow store copied along (mlflow.db and mlartifacts/ are not
    committed): the clone's store points at its own artifacts once opened, and every run's history.csv opens."""
    import shutil

    root, env, _ = repo
    clone = tmp_path / "clone"
    _run(["git", "clone", "-q", str(root), str(clone)], tmp_path, env)
    shutil.copy(root / "mlflow.db", clone / "mlflow.db")
    shutil.copytree(root / "mlartifacts", clone / "mlartifacts")
    code = (
        "import json, mlflow; from noisydml.tracking import open_store;"
        f"client = open_store('sqlite:///{clone / 'mlflow.db'}');"
        "runs = mlflow.search_runs(experiment_names=['noisydml-glyphs'], output_format='list');"
        "print(json.dumps([[r.info.artifact_uri, [a.path for a in client.list_artifacts(r.info.run_id)]] for r in runs]))"
    )
    env = {**env, "MLFLOW_TRACKING_URI": f"sqlite:///{clone / 'mlflow.db'}"}
    runs = json.loads(_run([sys.executable, "-c", code], clone, env).strip().splitlines()[-1])
    assert runs and all(uri.startswith((clone / "mlartifacts").as_uri()) for uri, _ in runs), runs
    assert all("history.csv" in artifacts for _, artifacts in runs), runs


def test_report_shows_selection_and_training_time(repo):
    root, _, _ = repo
    selection = pd.read_csv(root / "reports" / "selection.csv")
    assert sorted(selection["noise"]) == ["clean", "sc25", "scrun", "sym50"] and set(selection["method"]) == {"prism"}
    assert ((selection["final_diag_selection_precision"] >= 0) & (selection["final_diag_selection_precision"] <= 1)).all()
    clean = selection.set_index("noise").loc["clean"]
    assert clean["final_diag_selection_precision"] == 1.0 and clean["clean_fraction"] == 1.0
    times = pd.read_csv(root / "reports" / "training_time.csv")
    assert times["method"].tolist() == ["PRISM without centres"]
    assert (times["seconds/epoch"] > 0).all()
    history = pd.read_csv(root / "runs" / "glyphs" / "sym50" / "prism" / "seed0" / "history.csv")
    assert {"diag_selection_precision", "diag_selection_recall", "diag_kept_fraction"} <= set(history.columns)
    assert "epoch_seconds" not in history.columns  # volatile: kept out of hashed outputs
    report = (root / "reports" / "results.md").read_text()
    assert "## Sample selection" in report and "## Training time" in report
    # the PRISM study puts the slides' training time (CARS-98N, s, from references/papers/prism.csv) beside ours
    prism = report.split("## Training time beside PRISM's")[1].split("\n## ")[0]
    assert "| PRISM without centres |" in prism and "12294.8" in prism


def test_report_shows_small_cluster_statistics(repo):
    root, _, _ = repo
    stats = json.loads((root / "data" / "noisy" / "glyphs" / "sc25" / "stats.json").read_text())
    # 6 training classes of 6 images: 25% dissolves 2 classes, their 12 images move in clusters
    assert stats["num_classes_before"] == 6 and stats["num_classes_after"] == 4
    assert stats["num_noisy"] == 12 and stats["moved_clusters"]["count"] <= 6
    noise = pd.read_csv(root / "reports" / "noise_stats.csv").set_index("noise")
    assert noise.loc["sc25", "classes_after"] == 4 and noise.loc["sc25", "dissolved_classes"] == "2"
    assert noise.loc["sym50", "classes_after"] == 6
    report = (root / "reports" / "results.md").read_text()
    assert "Moved clusters (small-cluster noise)" in report and "cluster size |   glyphs, 25% small-cluster |" in report


def test_changing_one_noise_rate_dirties_only_its_branch(repo):
    root, env, _ = repo
    out = _run([sys.executable, "-m", "dvc", "exp", "run", "-S", "noise.sym50.rate=0.4"], root, env)  # DVC's -S
    ran = sorted(line.split("'")[1] for line in out.splitlines() if line.startswith("Running stage"))
    assert ran == ["corrupt@glyphs-sym50", "evaluate@glyphs", "report", "train@glyphs-sym50-ms-0",
                   "train@glyphs-sym50-prism-0", "train_chain@ms_on_prism_kept"]
    # the one evaluate process re-evaluated the three sym50 runs only
    assert "evaluate glyphs: 3 run(s) evaluated, 8 unchanged" in out
    stats = json.loads((root / "data" / "noisy" / "glyphs" / "sym50" / "stats.json").read_text())
    assert stats["nominal_rate"] == 0.4
    # CI's guard on the host that made the committed results: the changed metrics are a failure
    guard = subprocess.run([sys.executable, "-m", "noisydml.tools.guard", "--skip-pipeline-state", "--tolerance",
                            str(REPO / ".ci" / "tolerance.yaml")], cwd=root, env=env, capture_output=True, text=True)
    assert guard.returncode == 1 and "- glyphs/sym50/" in guard.stdout, guard.stdout


def _changed_stages(root, env):
    out = subprocess.run([sys.executable, "-m", "dvc", "status", "--json"], cwd=root, env=env, capture_output=True,
                         text=True, timeout=300)
    return sorted(json.loads(out.stdout or "{}"))


def test_adding_a_method_re_runs_nothing_and_editing_one_re_runs_only_its_stages(repo):
    """After the code_digests stage has digested the edit (a new method file, or an edit of one), `dvc status` names
    exactly the stages that train the methods whose code changed."""
    root, env, _ = repo
    methods = root / "src" / "noisydml" / "methods"
    params_path = root / "params.yaml"
    saved = params_path.read_text()
    # a new method: its own module plus its params section; no existing stage depends on either
    (methods / "my_new_method.py").write_text((methods / "ms.py").read_text())
    params = yaml.safe_load(saved)
    params["methods"]["my_new_method"] = params["methods"]["ms"]
    params_path.write_text(yaml.safe_dump(params, sort_keys=False))
    try:
        assert _changed_stages(root, env) == ["code_digests"]  # its dependency, src/noisydml, changed
        assert _changed_after_digest(root, env) == []
    finally:
        (methods / "my_new_method.py").unlink()
        params_path.write_text(saved)
    # editing PRISM's module dirties PRISM's runs only; editing ms's, ms's runs and the chained run training ms
    assert _changed_after_editing(methods / "prism.py", root, env) == [
        "timing@prism_eq3", "train@glyphs-clean-prism-0", "train@glyphs-sc25-prism-0", "train@glyphs-sym50-prism-0",
        "train_on_run_noise@glyphs-scrun-prism-0"]
    assert _changed_after_editing(methods / "ms.py", root, env) == [
        "train@glyphs-clean-ms-0", "train@glyphs-sc25-ms-0", "train@glyphs-sym50-ms-0", "train_chain@ms_on_prism_kept",
        "train_embedding_size@ms-8-0", "train_on_run_noise@glyphs-scrun-ms-0"]
    assert _changed_after_digest(root, env) == []


def test_a_study_or_the_report_changes_no_grid_run(repo):
    """Editing a study's check and the report, and adding a study, leave every grid and chained train stage clean
    in `dvc status` once digested (one status for the three edits; tests/test_runs.py checks each study's reach on
    DVC's own resolution of dvc.yaml)."""
    root, env, _ = repo
    src = root / "src" / "noisydml"
    edited = [src / "studies" / "sgps.py", src / "reporting" / "tables.py"]
    texts = [path.read_text() for path in edited]
    new = src / "studies" / "another_paper.py"
    for path, text in zip(edited, texts):
        path.write_text(text + AN_EDIT)
    new.write_text('from noisydml.studies.base import Study\n\n'
                   'STUDY = Study(name="another_paper", title="Another paper", report=lambda ctx: ["## Another"])\n')
    try:
        assert _changed_after_digest(root, env) == ["evaluate@glyphs", "report"]
    finally:
        new.unlink()
        for path, text in zip(edited, texts):
            path.write_text(text)
    assert _changed_after_digest(root, env) == []


#: An edit that changes what a module does (a new module-level name): a comment no longer re-runs anything.
AN_EDIT = "\n_AN_EDIT = 1\n"


def _changed_after_digest(root, env):
    """The stages `noisydml status` calls changed: `dvc status` once the digest stages have digested the code."""
    out = subprocess.run([sys.executable, "-m", "noisydml.tools.console", "status", "--json"], cwd=root, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "digest stages run: code_digests" in out.stderr
    return sorted(json.loads(out.stdout or "{}"))


def _changed_after_editing(path, root, env):
    """The stages `dvc status` calls changed while ``path`` carries a change of behaviour (then restored), once
    digested."""
    text = path.read_text()
    path.write_text(text + AN_EDIT)
    try:
        return _changed_after_digest(root, env)
    finally:
        path.write_text(text)


def test_evaluate_succeeds_without_mlflow_database(repo):
    """DVC outputs never depend on tracker state: a missing mlflow.db warns, the stage succeeds."""
    root, env, _ = repo
    db = root / "mlflow.db"
    moved = root.parent / "mlflow.db.away"
    db.rename(moved)
    try:
        (root / "metrics" / "glyphs" / "clean" / "ms" / "seed0.json").unlink()  # re-evaluated, logged to MLflow
        out = _run([sys.executable, "-m", "dvc", "repro", "-f", "-s", "evaluate@glyphs"], root, env)
        assert "Running stage 'evaluate@glyphs'" in out and "1 run(s) evaluated" in out
    finally:
        if db.exists():
            db.unlink()
        moved.rename(db)


def test_noise_clustered_on_a_run_is_a_dvc_edge_and_is_remade_when_the_run_changes(repo):
    root, env, _ = repo
    dot = _run([sys.executable, "-m", "dvc", "dag", "--dot", "train_on_run_noise@glyphs-scrun-prism-0"], root, env)
    assert '"train@glyphs-clean-ms-0" -> "corrupt_from_run@glyphs-scrun"' in dot
    assert '"corrupt_from_run@glyphs-scrun" -> "train_on_run_noise@glyphs-scrun-prism-0"' in dot
    stats_path = root / "data" / "noisy" / "glyphs" / "scrun" / "stats.json"
    stats = json.loads(stats_path.read_text())
    assert stats["features"]["run"] == "glyphs-clean-ms-0" and stats["num_classes_after"] == 4
    assert "25% small-cluster (clusters of a run's embeddings)" in (root / "reports" / "results.md").read_text()
    # retraining the run re-makes the labels clustered on its embeddings, and only those
    params_path = root / "params.yaml"
    saved = params_path.read_text()
    params = yaml.safe_load(saved)
    params["methods"]["ms"]["loss"]["alpha"] = 3.0
    params_path.write_text(yaml.safe_dump(params, sort_keys=False))
    try:
        out = _run([sys.executable, "-m", "dvc", "repro", "corrupt_from_run@glyphs-scrun"], root, env)
        ran = sorted(line.split("'")[1] for line in out.splitlines() if line.startswith("Running stage"))
        assert ran == ["corrupt_from_run@glyphs-scrun", "train@glyphs-clean-ms-0"]
        assert json.loads(stats_path.read_text())["features"]["sha256"] != stats["features"]["sha256"]
    finally:
        params_path.write_text(saved)
    _run([sys.executable, "-m", "dvc", "repro"], root, env)  # back to the fixture's state (restored from cache)
    assert _changed_stages(root, env) == []
