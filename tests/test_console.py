"""The ``noisydml`` console command runs the package of the checkout it is run in.

A clone that shares another checkout's virtual environment imports that checkout's editable package; without a
re-start its stages (and the launcher's Ray workers) would run the other checkout's code while DVC records this
one's hashes."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import REPO


def _checkout_with_marked_package(root: Path) -> None:
    """``root/src``: a copy of this package whose ``noisydml guard`` prints a marker when it is imported."""
    shutil.copytree(REPO / "src", root / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    with open(root / "src" / "noisydml" / "tools" / "guard.py", "a") as f:
        f.write('\nprint("the copy\'s guard")\n')


def _noisydml(root: Path, env: dict) -> subprocess.CompletedProcess:
    command = Path(sys.executable).parent / "noisydml"
    return subprocess.run([str(command), "guard", "--help"], cwd=root / "src", env=env, capture_output=True,
                          text=True, timeout=120)


def test_a_checkout_sharing_another_ones_environment_runs_its_own_package(tmp_path):
    _checkout_with_marked_package(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NOISYDML_OWN_PACKAGE_STARTED")}
    shared = _noisydml(tmp_path, env)  # from a subfolder: the checkout is found upwards, as DVC finds its repository
    assert shared.returncode == 0, shared.stderr
    assert "the copy's guard" in shared.stdout
    assert f"running this checkout's package ({(tmp_path / 'src' / 'noisydml').resolve()})" in shared.stderr

    own = _noisydml(tmp_path, {**env, "PYTHONPATH": str(tmp_path / "src")})
    assert own.returncode == 0, own.stderr
    assert "the copy's guard" in own.stdout and "running this checkout's package" not in own.stderr


def test_the_environments_package_is_used_outside_a_checkout(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NOISYDML_OWN_PACKAGE_STARTED")}
    done = subprocess.run([str(Path(sys.executable).parent / "noisydml"), "guard", "--help"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "running this checkout's package" not in done.stderr
