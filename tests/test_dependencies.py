"""Each stage depends on the code units it runs (digested by meaning); import layering; no hidden defaults in params.yaml."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO, load_script

stage_deps = load_script("stage_deps")

DVC = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]


def _method_names():
    from noisydml.methods import method_names

    return method_names()


#: A code unit as a stage declares it: ``code/<kind>/<name>.json``, or the folder of every study's.
CODE_UNIT = re.compile(r"^code/(stages|methods|studies|datasets|training)/(.+)\.json$")


@pytest.mark.parametrize("name", sorted(DVC))
def test_a_stage_depends_on_its_scripts_code_unit_and_on_no_source_file(name):
    """Every stage's code dependency is its script's unit (code/stages/<script>.json, what the code_digests stage
    writes: its files digested by meaning); a study's run also on that study's unit; none on a file or folder of
    src/ or stages/ (their bytes change with a comment), but the code_digests stage, which reads them."""
    body = DVC[name].get("do", DVC[name])
    deps = body["deps"]
    if name == "code_digests":
        assert deps == ["src/noisydml", "stages"]
        assert body["outs"] == ["code/stages", "code/methods", "code/studies", "code/datasets", "code/training"]
        assert body["params"] == ["datasets"]  # each dataset's kind names the module of its unit
        return
    assert not [d for d in deps if d.startswith(("src/", "stages/"))], "depend on a code unit, not a source file"
    script = stage_deps.script_of(body)
    assert f"code/stages/{script}.json" in deps
    units = [m.groups() for d in deps if (m := CODE_UNIT.match(d))]
    assert [n for kind, n in units if kind == "stages"] == [script]
    from noisydml.studies import study_names

    assert {n for kind, n in units if kind == "studies"} <= set(study_names())
    study = re.search(r"--study (\w+)", body["cmd"])
    if study:  # a study's run imports its study's module by name
        assert f"code/studies/{study.group(1)}.json" in deps
    # a dataset's kind is imported by name: download and prepare depend on the dataset's unit; a stage that writes
    # a run folder on what its dataset's kind runs after training (face verification), on that dataset
    if script in ("download", "prepare"):
        assert "code/datasets/${item}.json" in deps
    prepared = [d[len("data/prepared/"):] for d in deps if d.startswith("data/prepared/")]
    if script in ("train", "train_tuned"):
        assert [f"code/training/{d}.json" for d in prepared] == [d for d in deps if d.startswith("code/training/")]
    else:
        assert not [d for d in deps if d.startswith(("code/training/", "code/datasets/"))] or script in (
            "download", "prepare")


def test_the_stages_that_read_every_study_depend_on_every_studys_unit():
    """evaluate and report import every study by name: they depend on the folder of study units."""
    for name in ("evaluate", "report"):
        assert "code/studies" in DVC[name].get("do", DVC[name])["deps"], name


def test_a_stage_scripts_unit_is_its_import_closure_and_its_sections_owners(tmp_path, monkeypatch):
    """code/stages/<script>.json names the files the script imports (closure), and the modules validating the
    params sections it loads (imported by name): report's holds its own section's owner, report_params."""
    from noisydml.closure import closure, file_name
    from noisydml.pipeline.code_digests import code_unit, unit_names

    monkeypatch.chdir(REPO)
    assert set(unit_names("stages")) == {p.stem for p in (REPO / "stages").glob("*.py")}
    train = code_unit("stages", "train")["files"]
    assert {file_name(p) for p in closure(REPO / "stages" / "train.py")} <= set(train)
    assert "stages/train.py" in train and "noisydml/engine/trainer.py" in train
    assert "noisydml/pipeline/report_params.py" not in train  # report's section: the report stage's alone
    assert "noisydml/pipeline/report_params.py" in code_unit("stages", "report")["files"]
    # dataset kinds and face verification are imported by name, in the datasets' units: not the trainer's code
    assert not [f for f in train if f.startswith("noisydml/data/kinds/")]
    assert "noisydml/pipeline/face_features.py" not in train
    kinds = {"glyphs": "glyphs", "faces": "faces"}
    assert "noisydml/data/kinds/glyphs.py" in code_unit("datasets", "glyphs", datasets=kinds)["files"]
    assert "noisydml/data/kinds/faces.py" not in code_unit("datasets", "glyphs", datasets=kinds)["files"]
    assert code_unit("training", "glyphs", datasets=kinds)["files"] == {}
    assert "noisydml/pipeline/face_features.py" in code_unit("training", "faces", datasets=kinds)["files"]
    # a section's schema is in the units of the stages that load it: noise_runs in corrupt's, not in train's
    assert "noisydml/sections/noise_runs.py" in code_unit("stages", "corrupt")["files"]
    assert "noisydml/sections/noise_runs.py" not in train


def test_the_stages_closures_read_once_are_the_closures(monkeypatch):
    """write_code_digests reads each file's imports once for every unit (code_digests.closures): the same files as
    noisydml.closure.closure of each unit's roots."""
    from noisydml.pipeline.code_digests import closures, unit_files, unit_names, unit_roots

    monkeypatch.chdir(REPO)
    kinds = {"glyphs": "glyphs", "faces": "faces"}
    units = [("stages", name) for name in unit_names("stages")] + [
        ("methods", "prism"), ("methods", "sgps"), ("studies", "sgps"), ("datasets", "glyphs"), ("training", "faces"),
        ("training", "glyphs")]
    read_once = closures({unit: unit_roots(*unit, datasets=kinds) for unit in units})
    assert read_once == {unit: unit_files(*unit, datasets=kinds) for unit in units}


def test_a_digest_follows_meaning_not_bytes(tmp_path, monkeypatch):
    """A comment, a docstring, a bare string or a layout edit changes no file's digest; a changed constant, name or
    statement does."""
    from noisydml.closure import file_digests

    def digest_of(text):
        (tmp_path / "m.py").write_text(text)
        return file_digests([tmp_path / "m.py"])

    monkeypatch.chdir(tmp_path)
    base = digest_of('"""Doc."""\n\ndef f(x):\n    """Eq. (3)."""\n    return x + 1\n')
    assert digest_of('"""Other doc."""\n# a comment\ndef f( x ):  # why\n    """Eq. (4)."""\n\n    "note"\n'
                     '    return (x + 1)\n') == base
    assert digest_of('"""Doc."""\n\ndef f(x):\n    return x + 2\n') != base
    assert digest_of('"""Doc."""\n\ndef g(x):\n    return x + 1\n') != base
    assert digest_of('"""Doc."""\n\ndef f(x):\n    """Eq. (3)."""\n') != base  # body gone: pass


#: A method's code file, or a tuned chain's lineage file, as a stage declares it.
METHOD_CODE = re.compile(r"^code/methods/(.+)\.json$")
LINEAGE = "code/chains/${item.dataset}-${item.noise}-${item.chain}.json"


def _training_stages() -> dict[str, str | None]:
    """Every stage of dvc.yaml that trains (its script is one that builds a model), and the method it trains: a
    template of its item, or fixed; None for a tuned chain (its lineage file stands for its methods). Read from
    dvc.yaml, so a study's new stage template is checked without an entry here."""
    out = {}
    for name, stage in DVC.items():
        body = stage.get("do", stage)
        if stage_deps.script_of(body) not in ("train", "train_tuned", "tune", "timing"):
            continue
        methods = [m.group(1) for d in body["deps"] if (m := METHOD_CODE.match(d))]
        out[name] = methods[0] if len(methods) == 1 else None
    return out


TRAINING_STAGES = _training_stages()


def test_the_training_stages_are_found_in_dvc_yaml():
    """The stages read as training ones: every train/tune/timing template, each with its one method code file
    (a tuned chain: none, its lineage instead)."""
    assert {"train", "train_on_run_noise", "train_embedding_size", "train_bspml_cell", "train_sgps_ablation",
            "train_chain", "tune", "train_tuned", "timing", "tune_chain", "train_tuned_chain"} <= set(TRAINING_STAGES)
    assert TRAINING_STAGES["train_bspml_cell"] == "bspml" and TRAINING_STAGES["train"] == "${item.method}"
    assert TRAINING_STAGES["tune_chain"] is None and TRAINING_STAGES["train_tuned_chain"] is None


@pytest.mark.parametrize("stage", sorted(TRAINING_STAGES))
def test_a_training_stage_depends_on_its_methods_code_file_and_on_no_method_source(stage):
    """A stage that trains a method depends on that method's code file (code/methods/<method>.json: its module and
    the parts it imports, digested by the code_digests stage), never on methods/ or methods/parts itself; a tuned
    chain, whose method DVC's templates cannot look up, on its lineage's file (code/chains/..., the chain_code
    stage's: its chains, their methods' hyper-parameters and code files), and on neither methods nor chains."""
    body = DVC[stage].get("do", DVC[stage])
    deps, method = body["deps"], TRAINING_STAGES[stage]
    assert (f"code/methods/{method}.json" if method else LINEAGE) in deps
    if method is None:
        assert not {"methods", "chains", "tuning.spaces"} & set(body["params"])
    sources = [d for d in deps if d.startswith("src/noisydml/methods")]
    assert set(sources) <= {"src/noisydml/methods/__init__.py", "src/noisydml/methods/base.py"}, sources


def test_a_methods_unit_names_its_module_and_parts_never_another_methods(monkeypatch):
    """code/methods/<method>.json names exactly the package files the method's module imports: its parts, never
    another method's module, directly or through a part (so an edit of one method re-trains that method's runs
    only). This is the methods' independence rule, checked on the closure that decides what re-runs: a new method
    is its file and its params entry, no list to extend."""
    from noisydml.closure import closure
    from noisydml.pipeline.code_digests import code_unit

    monkeypatch.chdir(REPO)
    for name in _method_names():
        files = set(code_unit("methods", name)["files"])
        imported = {str(p.relative_to(REPO / "src")) for p in
                    closure(REPO / "src" / "noisydml" / "methods" / f"{name}.py")}
        assert files == imported, name
        others = {f"noisydml/methods/{m}.py" for m in _method_names() if m != name}
        assert not files & others, name


def _sections_declared(stage: dict) -> set[str]:
    """The top-level params sections a dvc.yaml stage declares (but runtime, which every stage loads)."""
    return {p.split(".")[0] for p in stage.get("do", stage).get("params", []) if isinstance(p, str)} - {"runtime"}


@pytest.mark.parametrize("name", sorted(DVC))
def test_a_stage_loads_every_params_section_it_declares(name):
    """A stage script loads (validates and may read) the sections its dvc.yaml stage declares; the tuned runs' view
    of tuning (tuned_runs) stands for the tuning keys that name runs."""
    script = REPO / "stages" / f"{stage_deps.script_of(DVC[name].get('do', DVC[name]))}.py"
    sections = stage_deps.stage_sections(script)
    if sections is None:
        return
    from noisydml.config import sections_with_needs

    grid_item = "run_grid_stage" in script.read_text()  # a stage of a grid item loads grid to refuse one it lacks
    loaded = set(sections_with_needs(("runtime", *sections, *(["grid"] if grid_item else []))))
    if "tuned_runs" in loaded:
        loaded.add("tuning")
        body = DVC[name].get("do", DVC[name])
        assert {p for p in body["params"] if p.startswith("tuning")} <= {f"tuning.{k}" for k in
                                                                          ("datasets", "noises", "methods", "chains")}
    assert _sections_declared(DVC[name]) <= loaded


@pytest.mark.parametrize("name", sorted(DVC))
def test_the_runtime_keys_that_change_results_are_declared_where_they_do(name):
    """Every stage that trains declares the runtime keys that change what it computes (numerics and threads where
    it computes floats: also corrupt, pretrain, evaluate, BSPML's maps, the label audit); none declares the others."""
    from noisydml.runtime import TRACKED_RUNTIME

    declared = {p.split(".", 1)[1] for p in DVC[name].get("do", DVC[name]).get("params", [])
                if isinstance(p, str) and p.startswith("runtime.")}
    if name in TRAINING_STAGES:
        assert declared == set(TRACKED_RUNTIME)
    elif name in ("pretrain", "corrupt", "corrupt_from_run", "evaluate", "bspml_maps", "audit"):
        assert declared == {"numerics", "threads"}
    else:
        assert declared == set()


def test_import_layers_hold():
    """The import-linter contracts in pyproject.toml (no cycles; layers import downwards only)."""
    lint = Path(sys.executable).parent / "lint-imports"
    proc = subprocess.run([str(lint)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "0 broken" in proc.stdout


def test_every_schema_key_is_written_in_params_yaml():
    """No hidden defaults: every key a schema knows is in params.yaml, so `dvc params diff` shows it."""
    from noisydml.data.registry import DATASET_KINDS
    from noisydml.runtime import RUNTIME_SCHEMA
    from noisydml.sections import grid, timing, tracking, train
    from noisydml.methods import load_spec
    from noisydml.noise import NOISE_KINDS

    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    missing = []

    def need(section: dict, schema: dict, where: str):
        missing.extend(f"{where}.{k}" for k in schema if k not in (section or {}))

    from noisydml.evaluation import EVALUATE_SCHEMA
    from noisydml.pipeline.report_params import REPORT_SCHEMA

    for key, schema in (("train", train.TRAIN_SCHEMA), ("runtime", RUNTIME_SCHEMA),
                        ("evaluate", EVALUATE_SCHEMA), ("tracking", tracking.TRACKING_SCHEMA),
                        ("report", REPORT_SCHEMA), ("timing", timing.TIMING_SCHEMA),
                        ("grid", grid.GRID_SCHEMA)):
        need(raw[key], schema, key)
    need(raw["train"]["batch"], train.BATCH_SCHEMA, "train.batch")
    need(raw["train"]["optimizer"], train.OPTIMIZER_SCHEMA, "train.optimizer")
    need(raw["train"]["schedule"], train.SCHEDULE_SCHEMA, "train.schedule")
    for name in _method_names():
        assert name in raw["methods"], f"methods.{name} is missing from params.yaml"
        spec = load_spec(name)
        need(raw["methods"][name], spec.schema, f"methods.{name}")
        for sub, schema in (spec.nested or {}).items():
            need(raw["methods"][name][sub], schema, f"methods.{name}.{sub}")
    for name, body in raw["datasets"].items():
        need(body, DATASET_KINDS[body["kind"]].schema, f"datasets.{name}")
    for name, body in raw["noise"].items():
        need(body, NOISE_KINDS[body["kind"]].schema, f"noise.{name}")
    assert missing == []


def test_the_whole_params_file_is_valid():
    from noisydml.tools.check import main

    assert main([str(REPO / "params.yaml")]) == 0


def test_no_reporting_module_names_a_method_or_a_paper():
    """reporting/ is generic: a method's or a paper's own tables, figures and numbers live in its study
    (noisydml.studies) and in references/papers/*.csv. Checked on identifiers and string constants."""
    import ast

    from noisydml.methods import method_names

    methods = set(_method_names())
    papers = ("prism", "sgps", "bspml", "smooth proxy", "proxy-anchor")
    for path in sorted((REPO / "src" / "noisydml" / "reporting").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value
            elif isinstance(node, ast.Name):
                text = node.id
            elif isinstance(node, ast.Attribute):
                text = node.attr
            else:
                continue
            words = set(text.replace("`", " ").replace(",", " ").replace("(", " ").replace(")", " ").split())
            assert not (words & methods), f"{path.name}:{node.lineno}: names a method: {sorted(words & methods)}"
            assert not any(p in text.lower() for p in papers), f"{path.name}:{node.lineno}: names a paper: {text!r}"
    assert method_names()  # the catalog was read


class _ReadsRecorded(dict):
    """A params mapping that records the dotted path of every leaf value read through it (nested mappings too)."""

    def __init__(self, data: dict, path: str, read: set):
        super().__init__(data)
        self._path, self._read = path, read

    def __getitem__(self, key):
        value = super().__getitem__(key)
        path = f"{self._path}.{key}" if self._path else str(key)
        if isinstance(value, dict):
            return _ReadsRecorded(value, path, self._read)
        self._read.add(path)
        return value

    def get(self, key, default=None):
        return self[key] if key in self else default


def _declared_params(stage: dict) -> list[str]:
    return [p for p in stage.get("do", stage).get("params", []) if isinstance(p, str)]


def _covered(path: str, declared: list[str]) -> bool:
    return any(path == d or path.startswith(d + ".") for d in declared)


def test_the_pretrain_stage_declares_every_param_it_reads(tmp_path):
    """A params key the stage reads but dvc.yaml does not declare changes the weights without DVC re-running the
    stage (pretrain.source once went undeclared: switching to motifs kept the glyph weights). The stage runs on a
    tiny source set with every read recorded; `runtime` is untracked by design (how runs execute)."""
    from noisydml.config import load_params
    from noisydml.pipeline.layout import Layout
    from noisydml.pipeline.pretrain import pretrain

    params = load_params(REPO / "params.yaml")
    params["pretrain"].update(classes=4, images_per_class=8, epochs=1, batch_size=8)
    params["runtime"]["progress"] = False
    read: set[str] = set()
    pretrain(_ReadsRecorded(params, "", read), Layout(root=tmp_path))
    assert {"pretrain.source", "pretrain.classes", "train.pretrained"} <= read  # the recorder sees the reads
    undeclared = sorted(p for p in read if not p.startswith("runtime.") and not _covered(p, _declared_params(DVC["pretrain"])))
    assert undeclared == [], f"pretrain reads {undeclared}, which dvc.yaml's pretrain stage does not declare"
