"""``-S`` as a transaction (noisydml.tools.overrides, ``noisydml launch -S``): DVC's meaning, our careful write.

A refused value and ``--dry`` leave params.yaml byte-identical; a valid ``-S`` changes its value's line only,
comments and YAML anchors kept, and the file then holds exactly the data DVC's own ``-S`` gives; a write killed
at any moment leaves the old file or the new one.
"""

from __future__ import annotations

import difflib
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import REPO, run_command
from noisydml.config import read_params_file
from noisydml.tools.overrides import apply, dvc_apply
from noisydml.schema import ParamsError


def _changed_lines(before: str, after: str) -> list[str]:
    return [line for line in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]


OVERRIDES = [
    (["train.epochs=3"], 1),  # a block mapping's value
    (["noise.sym50.rate=0.4"], 1),  # inside a flow mapping
    (["grid.methods=[ms,prism]"], 1),  # an alias replaced by a list
    (["grid.seeds=[0,1,2]", "train.optimizer.lr=3e-5"], 2),  # two at once; DVC writes 3e-05
    (["+train.note=abc"], 1),  # a new key: one new line
    (["+noise.sym30={kind: symmetric, rate: 0.3}"], 1),  # a new mapping
    (["+datasets.faces_clean.extra=1"], 1),  # a new key in a flow mapping that spans lines
    (["method_sets.default=[ms]"], None),  # an anchor's own value: its aliases keep the old one, as DVC's do
    (["runtime.numerics=portable"], 0),  # the value it has
]


@pytest.mark.parametrize("overrides,lines", OVERRIDES, ids=[" ".join(o) for o, _ in OVERRIDES])
def test_a_valid_override_changes_its_lines_only_and_gives_dvcs_data(overrides, lines, tmp_path):
    text = (REPO / "params.yaml").read_text()
    edit = apply(REPO / "params.yaml", overrides)
    assert edit.careful, overrides
    changed = _changed_lines(text, edit.text)
    if lines is not None:
        assert len([c for c in changed if c.startswith("+")]) == lines, changed
    # every comment and anchor of the file is still there (a changed line keeps its trailing comment)
    for mark in ("&default_methods", "&all_baselines", "&noise_robust", "&classification_baselines", "&bspml_table"):
        assert mark in edit.text
    assert edit.text.count("#") >= text.count("#") - sum(c.count("#") for c in changed if c.startswith("-"))
    # the data is DVC's: its own -S on another copy, read back
    copy = tmp_path / "params.yaml"
    shutil.copy(REPO / "params.yaml", copy)
    dvc_apply(copy, overrides)
    mine = tmp_path / "mine.yaml"
    mine.write_text(edit.text)
    assert read_params_file(mine) == read_params_file(copy)


def test_a_refused_or_dry_override_leaves_params_yaml_byte_identical(tmp_path):
    from noisydml.tools.rehearsal import stage_env

    env = stage_env()
    root = tmp_path / "repo"
    root.mkdir()
    shutil.copy(REPO / "params.yaml", root / "params.yaml")
    # a toy pipeline that reads the grid, so that --dry -S can say what a new seed adds
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"seeded": {
        "foreach": "${grid.seeds}", "do": {"cmd": "echo ${item} > s${item}.txt", "params": ["train.epochs"],
                                           "outs": ["s${item}.txt"]}}}}))
    run_command(["git", "init", "-q"], root, env)
    run_command([sys.executable, "-m", "dvc", "init", "-q"], root, env)
    before = (root / "params.yaml").read_bytes()
    launch = [sys.executable, "-m", "noisydml.tools.launch"]
    for args in (["--dry", "-S", "noise.sym50.rate=50"], ["-S", "noise.sym50.rate=50"],
                 ["-S", "train.epochs=3", "-S", "train.optimizer.name=adamw2"], ["-S", "no.such.key=1"]):
        proc = subprocess.run([*launch, *args], cwd=root, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert (root / "params.yaml").read_bytes() == before, args
    assert "did you mean 'adamw'" in proc.stderr or "no.such" in proc.stderr
    dry = subprocess.run([*launch, "--dry", "-S", "grid.seeds=[0,1]", "-S", "train.epochs=2"], cwd=root, env=env,
                         capture_output=True, text=True, timeout=300)
    assert dry.returncode == 0, dry.stderr
    assert (root / "params.yaml").read_bytes() == before
    assert "would run  seeded@0" in dry.stdout  # its params change
    assert "would run  seeded@1 (new with the -S values" in dry.stdout
    assert "duration unknown" in dry.stdout and "~0.0 min" not in dry.stdout
    assert "params.yaml not changed" in dry.stdout
    fewer = subprocess.run([*launch, "--dry", "-S", "grid.seeds=[1]", "-S", "figures.bspml_maps.glyphs_sym50.seed=1"],
                           cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert fewer.returncode == 0, fewer.stderr
    # seed 0 leaves the graph: not a stage the launch would run
    assert "would run  seeded@0" not in fewer.stdout and "would run  seeded@1 (new" in fewer.stdout
    assert "not in the graph with the -S values: 1 stage(s) (e.g. seeded@0)" in fewer.stdout


def test_a_missing_key_without_plus_says_how_to_add_it(tmp_path):
    with pytest.raises(ParamsError, match=r"\+section\.key=value"):
        apply(REPO / "params.yaml", ["train.epoch=3"])


_WRITER = """
import sys
from pathlib import Path
from noisydml.io import write_text
path, a, b = Path(sys.argv[1]), Path(sys.argv[2]).read_text(), Path(sys.argv[3]).read_text()
print("ready", flush=True)
i = 0
while True:
    write_text(path, a if i % 2 else b)
    i += 1
"""


def test_a_write_killed_at_any_moment_leaves_a_whole_file(tmp_path):
    a = (REPO / "params.yaml").read_text()
    b = apply(REPO / "params.yaml", ["train.epochs=3"]).text
    (tmp_path / "a.yaml").write_text(a)
    (tmp_path / "b.yaml").write_text(b)
    target = tmp_path / "params.yaml"
    target.write_text(a)
    for delay in (0.05, 0.11, 0.17, 0.23, 0.31):
        writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(target), str(tmp_path / "a.yaml"),
                                   str(tmp_path / "b.yaml")], stdout=subprocess.PIPE, text=True)
        assert writer.stdout.readline().strip() == "ready"
        time.sleep(delay)
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        assert target.read_text() in (a, b)
    assert Path(target).stat().st_size in (len(a.encode()), len(b.encode()))


def test_a_url_in_a_flow_mapping_reads_as_dvc_writes_it():
    """`-S +datasets.mine={..., url: http://host:port/...}` is written by DVC in flow style; ruamel.yaml's own
    (YAML 1.2) scanner reads it. libyaml's (the optional ruamel.yaml.clib, which DVC and we would then use) refuses a
    ':' inside a plain scalar of a flow mapping: installing it would make DVC fail on params files it wrote itself
    (docs/launch.md, "Feedback time")."""
    from ruamel.yaml import YAML

    assert YAML(typ="safe").load("a: {url: http://127.0.0.1:1/x.tgz}\n") == {"a": {"url": "http://127.0.0.1:1/x.tgz"}}
