"""The README's audit section ("Find the wrong labels in your data") run as written, through real `dvc exp run`, on a
folder dataset with wrong labels: its three commands read from the README's own block, in a temporary git + DVC
repository whose params.yaml names the dataset ``mine`` as the README says a user does (and, for the test's
minutes, a tiny backbone and pretraining). Minutes, so marked ``rehearsal`` (not in the default run; CI runs it
after the suite: `python -m pytest -q -n 0 -m rehearsal tests/test_readme_audit.py`)."""

from __future__ import annotations

import colorsys
import shutil
import subprocess

import numpy as np
import pandas as pd
import pytest
import yaml
from PIL import Image

from conftest import REPO, dvc_repo, fenced_commands, tiny_params

SECTION = "## Find the wrong labels in your data"
#: The folder dataset: classes of one flat colour each (hues evenly apart, plus pixel noise), the first half
#: training, the second testing (the folder kind's default split); WRONG of each training class's images filed
#: under the next class (21 % of the training rows).
CLASSES, PER_CLASS, SIDE, WRONG = 16, 24, 16, 5


def readme_audit_commands() -> list[str]:
    """The shell commands of the audit section's fenced blocks, read as tests/test_documented_commands.py reads
    every documented command (continuations joined), in the README's order."""
    lines = (REPO / "README.md").read_text().splitlines()
    first = lines.index(SECTION) + 1
    last = next(n for n in range(first + 1, len(lines) + 1) if lines[n - 1].startswith("## "))
    return [command for key, command in fenced_commands().items()
            if key.startswith("README.md:") and first < int(key.split(":")[1]) < last]


def write_folder_dataset(root) -> pd.DataFrame:
    """``root/<class>/<k>.png``; returns the truth per training file (path relative to root, given, true class)."""
    rng = np.random.default_rng(0)
    colours = np.array([colorsys.hsv_to_rgb(c / CLASSES, 0.8, 0.5 + 0.4 * (c % 2)) for c in range(CLASSES)]) * 255
    names = [f"class{c:02d}" for c in range(CLASSES)]
    train = CLASSES // 2
    rows = []
    for c in range(CLASSES):
        for k in range(PER_CLASS):
            filed = (c + 1) % train if c < train and k < WRONG else c  # a wrong training label: the next class
            image = np.clip(colours[c] + rng.normal(0, 12, (SIDE, SIDE, 3)), 0, 255).astype("uint8")
            path = root / names[filed] / f"{names[c]}_{k}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image).save(path)
            if c < train:
                rows.append({"file": path.name, "given": names[filed], "true": names[c]})
    return pd.DataFrame(rows)


@pytest.mark.rehearsal
def test_the_readme_audit_runs_as_written_and_cleans_the_wrong_rows(tmp_path):
    commands = readme_audit_commands()
    assert [c.split()[:2] for c in commands] == [["dvc", "exp"], ["python", "scripts/label_audit.py"],
                                                 ["dvc", "exp"]], commands
    root = tmp_path / "repo"
    root.mkdir()
    truth = write_folder_dataset(tmp_path / "images")
    with open(REPO / "params.yaml") as f:
        raw = tiny_params(yaml.safe_load(f))
    # what the README tells a user to add: the dataset `mine` (here 16-pixel RGB images)
    raw["datasets"]["mine"] = {"kind": "folder", "root": str(tmp_path / "images"), "image_size": SIDE, "channels": 3}
    # the test's minutes, not the user's: a tiny pretraining for the embedded backbone, short training
    raw["train"]["pretrained"] = "embedded"
    raw["pretrain"].update(classes=8, images_per_class=6, image_size=16, epochs=1, batch_size=16)
    raw["train"].update(epochs=4, batch={"classes": 4, "per_class": 4}, backbone_width=8, embedding_dim=16)
    env, _ = dvc_repo(root, raw, repro=False)
    shutil.copytree(REPO / "scripts", root / "scripts")  # the README's second command is a script of the checkout
    outputs = []
    for command in commands:  # as written, in a shell, in the repository's root
        done = subprocess.run(["bash", "-c", command], cwd=root, env=env, capture_output=True, text=True,
                              timeout=1200)
        assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        outputs.append(done.stdout + done.stderr)

    # the audit: three seeds' runs, a sheet naming files and classes, a cleaned listing
    assert all((root / "runs" / "mine" / "clean" / "ms" / f"seed{s}").is_dir() for s in range(3))
    pages = sorted((root / "sheets").glob("*/index.html"))  # one sheet per run
    assert len(pages) == 3, pages
    sheet = pages[0].read_text()
    assert "class0" in sheet and ".png" in sheet
    suspects = pd.read_csv(pages[0].parent / "suspects.csv")
    assert {"path", "given_class", "suggested_class"} <= set(suspects.columns)
    cleaned = pd.read_csv(root / "mine-cleaned.csv")
    kept = set(cleaned["path"].map(lambda p: p.rsplit("/", 1)[-1]))
    wrong = set(truth.loc[truth["given"] != truth["true"], "file"])
    test_files = {f"class{c:02d}_{k}.png" for c in range(CLASSES // 2, CLASSES) for k in range(PER_CLASS)}
    assert test_files <= kept  # the test split is never cleaned
    dropped = set(truth["file"]) - kept
    assert dropped, outputs[1]  # it acted
    assert len(dropped & wrong) / len(dropped) >= 0.5, (sorted(dropped), sorted(wrong), outputs[1])

    # the retrain: params now name the cleaned listing, and the run trained on its training rows only
    params = yaml.safe_load((root / "params.yaml").read_text())
    assert params["datasets"]["mine"].get("csv") == "mine-cleaned.csv" and "root" not in params["datasets"]["mine"]
    manifest = pd.read_csv(root / "data" / "prepared" / "mine" / "manifest.csv")
    assert (manifest["split"] == "train").sum() == len(truth) - len(dropped)
    assert (root / "runs" / "mine" / "clean" / "ms" / "seed0").is_dir()
