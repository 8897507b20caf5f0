import copy
import os
import re
from pathlib import Path

# Test files run on several worker processes at once (pytest-xdist; pyproject.toml): OpenMP threads that spin while
# they wait starve the other worker's (measured ~60x slower on 2 cores); waiting threads sleep instead. Set before
# any test module loads torch; stages started by the tests inherit it. It does not change any result.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest
import yaml

from noisydml.config import read_params_file

REPO = Path(__file__).resolve().parents[1]

#: The README's example dataset of your own images ("Changing the grid") added to the grid, as the README tells the
#: reader to, before a documented override that names it (``mine``) is applied (tests/test_overrides.py,
#: tests/test_documented_commands.py).
README_OWN_DATASET = ["+datasets.mine={kind: folder, root: /path/to/images, image_size: 64, channels: 3}",
                      "grid.datasets=[glyphs,mine]"]


#: The fenced blocks whose lines are shell commands (README.md, docs/).
SHELL_LANGUAGES = ("bash", "sh", "shell", "console")


def fenced_commands() -> dict[str, str]:
    """``<page>:<line>`` -> one command of a fenced shell block (backslash continuations joined, comments cut,
    ``&&`` chains split, ``srun ...`` prefixes dropped)."""
    out = {}
    for page in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        text = page.read_text()
        for block in re.finditer(r"```(\w*)\n(.*?)```", text, re.S):
            if block.group(1) not in SHELL_LANGUAGES:
                continue
            first = text[: block.start()].count("\n") + 2
            body = re.sub(r"\\\n", " ", block.group(2))
            for offset, line in enumerate(body.splitlines()):
                if line.lstrip().startswith("#"):  # a comment, a shebang, #SBATCH
                    continue
                line = re.split(r"\s#\s", line, maxsplit=1)[0].strip()
                for part in re.split(r"\s&&\s", line):
                    part = re.sub(r"^srun(\s+(-\S+|--\S+=\S+|\"[^\"]*\"))*\s+(?=\w)", "", part.strip()).rstrip("&").strip()
                    if part:
                        out[f"{page.relative_to(REPO)}:{first + offset}:{part.split()[0]}"] = part
    return out


def load_script(name: str):
    """``scripts/<name>.py`` as a module (the scripts are not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def with_readme_dataset(overrides: list[str]) -> list[str]:
    """``overrides``, after :data:`README_OWN_DATASET` where one names the README's dataset ``mine``."""
    import re

    return (README_OWN_DATASET if any(re.search(r"\bmine\b", o) for o in overrides) else []) + list(overrides)


#: Seconds per test file (setup + call + teardown, summed over its tests), the longest measured: the suite's summary
#: (`seconds per test file`) of the full test command on a 2-core AMD EPYC (family 25 model 17), 2026-12-03. Files not
#: listed took under 75 s.
MEASURED_FILE_SECONDS = {
    "test_e2e.py": 426, "test_stage_scope.py": 364, "test_launch.py": 343, "test_e2e_sgps.py": 212,
    "test_tuning.py": 157, "test_runs.py": 155, "test_processes.py": 125, "test_refusals.py": 99,
    "test_params_edit.py": 89, "test_documented_commands.py": 86, "test_distributed.py": 78,
}


def pytest_collection_modifyitems(config, items):
    """The longest files first (:data:`MEASURED_FILE_SECONDS`), each file's tests in their order: pytest-xdist
    hands out whole files in collection order (``--dist loadfile --no-loadscope-reorder``, pyproject.toml), so the
    short files fill the other worker while a long one runs, instead of one worker running a long file alone at the
    end (longest first: the schedule's last finish is within the longest short file of the even split)."""
    items.sort(key=lambda item: -MEASURED_FILE_SECONDS.get(item.path.name, 0))


_MODULE_SECONDS: dict[str, float] = {}

#: What the repository's own MLflow store holds before the tests (no test may write into it: a test's runs are
#: tracked in its own folder's store, whose artifacts stay beside it).
_REPO_STORE = (REPO / "mlartifacts", REPO / "mlflow.db")
_store_before: dict = {}


def _store_state():
    files = set(p.relative_to(REPO).as_posix() for p in _REPO_STORE[0].rglob("*")) if _REPO_STORE[0].is_dir() else set()
    return files, _REPO_STORE[1].stat().st_mtime_ns if _REPO_STORE[1].exists() else None


def pytest_sessionstart(session):
    if not hasattr(session.config, "workerinput"):  # the controller (or a run without workers)
        _store_before["state"] = _store_state()


def pytest_sessionfinish(session, exitstatus):
    """Fail the run when a test wrote into the repository's mlartifacts/ or mlflow.db."""
    if "state" not in _store_before:
        return
    (files, mtime), (files_after, mtime_after) = _store_before["state"], _store_state()
    if files_after - files or mtime_after != mtime:
        session.config.pluginmanager.get_plugin("terminalreporter").write_line(
            f"FAILED: the tests wrote into the repository's MLflow store: {sorted(files_after - files)[:5]}"
            f"{' and mlflow.db' if mtime_after != mtime else ''}", red=True)
        session.exitstatus = 1


def pytest_runtest_logreport(report):
    """Sum each test file's time (setup, call and teardown; with xdist the controller gets every worker's reports)."""
    _MODULE_SECONDS[report.nodeid.split("::")[0]] = _MODULE_SECONDS.get(report.nodeid.split("::")[0], 0.0) \
        + report.duration


def pytest_terminal_summary(terminalreporter):
    """Seconds per test file, slowest first: where the suite's time goes, in every run's log (CI's included).
    With several workers the files overlap, so the column sums to more than the wall time."""
    if not _MODULE_SECONDS:
        return
    terminalreporter.write_sep("=", "seconds per test file (setup + call + teardown, summed over its tests)")
    for module, seconds in sorted(_MODULE_SECONDS.items(), key=lambda item: -item[1]):
        terminalreporter.write_line(f"{seconds:8.1f}  {module}")
    terminalreporter.write_line(f"{sum(_MODULE_SECONDS.values()):8.1f}  in all")


@pytest.fixture
def raw_params():
    """The repository's params.yaml as a plain mapping, to modify in a test (:func:`repository_params`)."""
    return repository_params()


def repository_params():
    """The repository's params.yaml as a plain mapping, to modify in a test.

    Runs start from scratch here (``train.pretrained: none``): a unit test has no pretrain stage's output;
    tests/test_pretrain.py and the end-to-end test cover the pretrained start. No figure stages (the
    end-to-end test has one)."""
    with open(REPO / "params.yaml") as f:
        raw = copy.deepcopy(read_params_file(f.name))
    raw["train"]["pretrained"] = "none"
    for section in raw["methods"].values():  # a random backbone is never frozen (the config refuses it)
        if isinstance(section, dict) and "freeze_backbone" in section:
            section["freeze_backbone"] = False
    raw["figures"]["bspml_maps"] = {}  # tests shrink the grid; a map needs its bspml run in it
    return raw


def tiny_params(raw):
    """Shrink params to a few glyph classes and one short epoch."""
    raw["datasets"]["glyphs"].update(num_classes=12, images_per_class=6, image_size=16)
    raw["train"].update(epochs=1, batch={"classes": 4, "per_class": 2}, eval_every=1, backbone_width=4, embedding_dim=8)
    raw["methods"]["mcl"]["memory_size"] = 64
    # one thread: a tiny model gains nothing from two, and MLflow's thread opening the run gets the other core
    raw["runtime"]["threads"] = 1
    return raw


def run_command(cmd, cwd, env, timeout=900):
    """Run ``cmd``; fail with the end of its output unless it exits 0. Returns stdout."""
    from noisydml.tools.rehearsal import run_checked

    return run_checked(cmd, cwd, env, timeout)


def dvc_repo(root, raw, targets=(), repro=True):
    """A temporary git + DVC repository at ``root`` with this repository's pipeline and code and ``raw`` as its
    params.yaml, after one `dvc repro` (of ``targets`` and what they need, or of everything; none when ``repro`` is
    false): ``(env, repro output)``. Stages run this interpreter."""
    import shutil
    import sys

    from noisydml.tools.rehearsal import stage_env

    for name in ("dvc.yaml", ".dvcignore", ".gitignore"):
        shutil.copy(REPO / name, root / name)
    # timing/, audit/, references/: the report stage's dependencies
    for name in ("stages", "plot_templates", "timing", "audit", "references"):
        shutil.copytree(REPO / name, root / name)
    shutil.copytree(REPO / "src", root / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    (root / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    # stages run this interpreter, whatever PATH says, and the copy's package (an edit there is what they run)
    env = {**stage_env(), "PYTHONPATH": str(root / "src")}
    run_command(["git", "init", "-q"], root, env)
    run_command([sys.executable, "-m", "dvc", "init", "-q"], root, env)
    run_command([sys.executable, "-m", "dvc", "config", "core.analytics", "false"], root, env)
    run_command(["git", "add", "-A"], root, env)
    run_command(["git", "commit", "-qm", "init"], root, env)
    if not repro:
        return env, ""
    return env, run_command([sys.executable, "-m", "dvc", "repro", *targets], root, env)


def batch_of(embeddings, labels, step=0, index=None, epoch=0, features=None):
    """A :class:`~noisydml.methods.base.Batch` for calling ``Method.loss`` directly in tests."""
    import torch

    from noisydml.methods.base import Batch

    index = torch.arange(len(labels)) if index is None else index
    features = embeddings.detach() if features is None else features
    return Batch(embeddings=embeddings, features=features, labels=labels, index=index, sample_id=index,
                 step=step, epoch=epoch)


class _Files:
    """What the local HTTP server serves: ``files[path] = bytes``; ``cut_once`` paths send half their bytes the first
    time (an interrupted transfer); ``log`` records ``(path, Range header)`` of every request."""

    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.cut_once: set[str] = set()
        self.log: list[tuple[str, str | None]] = []


@pytest.fixture
def local_server():
    """An HTTP server on 127.0.0.1 with Range support (the rehearsal's, :func:`noisydml.tools.rehearsal.serve`):
    ``(base_url, files)``."""
    from noisydml.tools.rehearsal import serve

    served = _Files()
    with serve(served.files, served.log, served.cut_once) as base_url:
        yield base_url, served


def serve_archives(server, files: dict[str, bytes]) -> dict:
    """Serve ``files`` (archive name -> bytes) on ``local_server``; return the ``archives`` override of a
    benchmark's dataset entry pointing at them."""
    import hashlib

    base, served = server
    out = {}
    for name, data in files.items():
        served.files[f"/{name}"] = data
        out[name] = {"url": f"{base}/{name}", "sha256": hashlib.sha256(data).hexdigest()}
    return out


def benchmark_params(raw, name: str, cfg: dict) -> dict:
    """``raw`` params reduced to the one benchmark dataset ``name`` (entry ``cfg``), validated."""
    from noisydml.tools.check import validate_all

    raw["datasets"] = {name: cfg}
    raw["grid"].update(datasets=[name], run_noises=[])
    raw["chains"], raw["noise_runs"] = {}, {}
    raw["timing"]["dataset"] = name
    raw["runtime"].update(progress=False, prepare_workers=1)
    raw["train"]["batch"] = {"classes": 2, "per_class": 2}
    return validate_all(raw)


# archives built in memory: the rehearsal's (noisydml.tools.rehearsal), which builds the datasets' miniatures
from noisydml.tools.rehearsal import tar_bytes, zip_bytes  # noqa: E402


def jpeg_bytes(seed: int, size=(20, 16)) -> bytes:
    """A small random RGB JPEG (``size`` = width, height): the rehearsal's, smaller."""
    from noisydml.tools.rehearsal import jpeg_bytes as rehearsal_jpeg

    return rehearsal_jpeg(seed, size)


def fit_job(spec, train_set, test_set, checkpoint_path, stop_after_epoch=None, **job):
    """One fit of the engine as the pipeline's job builder makes them (a :class:`~noisydml.engine.job.Job`, the
    default callbacks), with ``stop_after_epoch`` the seam that stops it after that epoch's checkpoint."""
    from noisydml.engine.callbacks import stop_after
    from noisydml.engine.job import Job
    from noisydml.engine.trainer import Trainer

    return Trainer(Job(spec, train_set, test_set, checkpoint_path, **job), callbacks=stop_after(stop_after_epoch)).fit()


class FakeServices:
    """A method test's :class:`~noisydml.methods.base.MethodServices`: ``build_network()`` calls ``build``;
    ``forward(batch, net[, transform])`` calls ``forward_with(net[, transform])``, set by the test per batch."""

    def __init__(self, build=None):
        self.build, self.forward_with = build, None

    def build_network(self):
        return self.build()

    def forward(self, batch, network=None, transform=None):
        return self.forward_with(network) if transform is None else self.forward_with(network, transform)

    def embed_train(self, network):
        raise NotImplementedError("FakeServices: no training rows here")


def grouped_sgps_state(m, seed=1):
    """An SGPS method (12 rows, 4-d) after one SGM round: a random bank and fixed ``c^B`` / ``c^T`` labellings;
    returns the generator, for the test's further draws."""
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(seed)
    m.bank.copy_(F.normalize(torch.randn(12, 4, generator=g), dim=1))
    m.bottom_up_labels.copy_(torch.tensor([0, 0, 1, 1, 2, 2, 0, 3, 3, 4, 4, 4]))
    m.top_down_labels.copy_(torch.tensor([0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 0]))
    m.sgm_round.fill_(1)
    m._set_pools()
    return g
