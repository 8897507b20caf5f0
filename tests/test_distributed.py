"""One run on two processes (DDP, gloo on the CPU) against the same run on one process with the same global batch.

Batch-norm is frozen (``train.frozen_bn``) in these runs: PyTorch's SyncBatchNorm runs on CUDA only, so on the
CPU each rank would normalise its own half of the batch and the two runs would differ by design.

Why these tests are slow (5-45 s each): every two-process run starts two fresh interpreters that import torch and
join a gloo group (several seconds before the first step); the resume test needs three such runs (whole, killed,
resumed).
"""

import copy
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from noisydml.config import load_params
from noisydml.data import glyphs
from noisydml.engine import distributed
from noisydml.engine.types import ImageSet, RunSpec
from noisydml.tools.check import check_all
from noisydml.schema import ParamsError
from conftest import fit_job

PARAMS = check_all(load_params("params.yaml"))
RUNTIME = {**PARAMS["runtime"], "progress": False, "threads": 1}


def _data():
    images, labels, _ = glyphs.generate(12, 6, 16, seed=0)
    train, test = labels < 6, labels >= 6
    return ImageSet(images[train], labels[train]), ImageSet(images[test], labels[test])


def _spec(method: str, epochs: int = 3) -> RunSpec:
    cfg = copy.deepcopy(PARAMS["train"])
    cfg.update({"epochs": epochs, "batch": {"classes": 3, "per_class": 2}, "backbone_width": 4, "embedding_dim": 8,
                "frozen_bn": True, "eval_every": 1})
    name = "sgps" if method == "sgps_forward" else method
    hp = copy.deepcopy(PARAMS["methods"][name])
    if "memory_size" in hp:
        hp["memory_size"] = 24
    if method == "sgps_forward":  # positives forwarded with the batch from SGM's first round, epoch 1
        hp.update(positive_source="forward", positives_per_sample=2)
        hp["sgm"].update(start_epoch=1)
    return RunSpec(name, hp, cfg, seed=5, data_fingerprint="test")


def _summary(result) -> dict:
    return {"history": result.history, "test": result.test_embeddings, "train": result.train_embeddings,
            "model": {k: v.clone() for k, v in result.model.state_dict().items()},
            "method": {k: v.clone() for k, v in result.method.state_dict().items() if isinstance(v, torch.Tensor)},
            "resumed_from": result.resumed_from_epoch, "device": result.device}


def _worker(rank: int, world: int, init: str, methods: list[str], checkpoint: str, out: str, stop: int | None):
    """One rank: each of ``methods`` trained in turn in the same process group (a fresh fit and checkpoint
    each), its summary saved to ``{out}.{method}.rank{rank}``."""
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    try:
        for method in methods:
            try:
                summary = _summary(fit_job(_spec(method), *_data(), checkpoint_path=checkpoint.format(method=method),
                                           runtime=RUNTIME, stop_after_epoch=stop))
            except KeyboardInterrupt:
                summary = {"stopped": True}
            torch.save(summary, f"{out}.{method}.rank{rank}")
    finally:
        dist.destroy_process_group()


def _two_processes(tmp_path: Path, methods: list[str], checkpoint: str, stop: int | None = None) -> dict:
    """Each of ``methods`` on two spawned ranks (one spawn for all: two processes' start-up, not one per method);
    ``checkpoint`` a path with ``{method}``. method -> [rank 0's summary, rank 1's]."""
    init = tempfile.mktemp(dir=tmp_path)
    out = str(tmp_path / f"two-{stop}")
    mp.spawn(_worker, args=(2, init, methods, checkpoint, out, stop), nprocs=2)
    return {m: [torch.load(f"{out}.{m}.rank{r}", weights_only=False) for r in range(2)] for m in methods}


def _one_process(tmp_path: Path, method: str) -> dict:
    torch.set_num_threads(1)
    return _summary(fit_job(_spec(method), *_data(), checkpoint_path=tmp_path / f"{method}-one.pt",
                            runtime=RUNTIME))


COMPARED = ["prism", "proxy_anchor", "sgps_forward"]


@pytest.fixture(scope="module")
def on_two_processes(tmp_path_factory):
    """The uninterrupted two-process runs of every compared method, in one spawn; prism's is also the reference of
    the resume test."""
    folder = tmp_path_factory.mktemp("whole")
    return _two_processes(folder, COMPARED, str(folder / "{method}-two.pt"))


@pytest.mark.parametrize("method", COMPARED)
def test_two_processes_follow_the_one_process_run(tmp_path, method, on_two_processes):
    """prism: the class-centre memory and XBM filled from the gathered batch; proxy_anchor: proxies (a method's
    own parameters, averaged over ranks); sgps_forward: extra rows (Method.extra_samples) split over the ranks and
    gathered back in order. Same losses to tolerance; every buffer and parameter identical across ranks, bit for
    bit."""
    one = _one_process(tmp_path, method)
    rank0, rank1 = on_two_processes[method]
    np.testing.assert_allclose([h["loss"] for h in rank0["history"]], [h["loss"] for h in one["history"]],
                               rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose([h["test_precision_at_1"] for h in rank0["history"]],
                               [h["test_precision_at_1"] for h in one["history"]], atol=1e-9)
    torch.testing.assert_close(rank0["test"], one["test"], rtol=1e-4, atol=1e-5)
    for part in ("model", "method"):
        assert rank0[part].keys() == rank1[part].keys() == one[part].keys()
        for key in rank0[part]:
            assert torch.equal(rank0[part][key], rank1[part][key]), f"{part}.{key} differs between ranks"
            if rank0[part][key].is_floating_point():
                torch.testing.assert_close(rank0[part][key], one[part][key], rtol=1e-3, atol=1e-4,
                                           msg=f"{part}.{key}")
            else:
                assert torch.equal(rank0[part][key], one[part][key]), f"{part}.{key}"
    assert torch.equal(rank0["test"], rank1["test"]) and torch.equal(rank0["train"], rank1["train"])
    assert rank0["history"] == rank1["history"]
    assert rank0["device"]["gpu_settings"]["distributed"] == {"processes": 2, "backend": "gloo",
                                                              "sync_batchnorm": False}
    assert "distributed" not in one["device"]["gpu_settings"]
    if method == "prism":  # the memory is not empty: the comparison above compared something
        assert int((rank0["method"]["memory.labels"] >= 0).sum()) > 0
    if method == "sgps_forward":  # L_noise ran on forwarded positives
        assert max(h["sgps_noise_batch"] for h in rank0["history"]) > 0


def test_two_processes_resume_after_a_kill(tmp_path, on_two_processes):
    checkpoint = tmp_path / "prism.pt"
    whole = on_two_processes["prism"]
    stopped = _two_processes(tmp_path, ["prism"], str(checkpoint), stop=1)["prism"]
    assert stopped == [{"stopped": True}, {"stopped": True}] and checkpoint.is_file()
    resumed = _two_processes(tmp_path, ["prism"], str(checkpoint))["prism"]
    assert resumed[0]["resumed_from"] == resumed[1]["resumed_from"] == 1
    assert [h["loss"] for h in resumed[0]["history"]] == [h["loss"] for h in whole[0]["history"]]
    assert torch.equal(resumed[0]["test"], whole[0]["test"])
    for key, value in whole[0]["method"].items():
        assert torch.equal(resumed[1]["method"][key], value), key


def test_batch_must_split_over_the_processes():
    with pytest.raises(ParamsError, match="a batch of 6 rows does not split over runtime.processes = 4"):
        distributed.Distributed(rank=0, world_size=4).check_batch(6)


def test_shards_cover_every_row_once():
    for n in (0, 1, 5, 6, 7):
        rows = [range(n)[distributed.Distributed(rank=r, world_size=3).shard(n)] for r in range(3)]
        assert [i for part in rows for i in part] == list(range(n))


def test_one_process_is_the_identity():
    one = distributed.Distributed()
    x = torch.arange(6.0).view(3, 2)
    assert one.gather_rows(x) is x and not one.active and one.is_main
    assert np.array_equal(one.local_rows(np.arange(6)), np.arange(6))


def test_torchrun_relaunch_of_a_stage(tmp_path):
    """``runtime.processes`` = 2 outside torchrun: the stage runs again as two torchrun processes, which join a
    gloo group from the environment torchrun sets (the train stage end to end: ``test_e2e``)."""
    script = tmp_path / "stage.py"
    script.write_text(
        "import sys, torch, torch.distributed as dist\n"
        "from noisydml.engine import distributed\n"
        "if not distributed.launched_by_torchrun():\n"
        "    sys.exit(distributed.relaunch_under_torchrun(2, sys.argv))\n"
        "d = distributed.init_from_environment('cpu')\n"
        "x = d.gather_rows(torch.full((2, 1), float(d.rank)))\n"
        "open(f'{sys.argv[1]}.{d.rank}', 'w').write(f'{d.rank} {d.world_size} {d.backend} {x.view(-1).tolist()}')\n"
        "dist.destroy_process_group()\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop(distributed.WORLD_SIZE_ENV, None)
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(script), str(out)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "runtime.processes = 2: " in done.stdout and "torch.distributed.run --standalone" in done.stdout
    for rank in (0, 1):
        assert Path(f"{out}.{rank}").read_text() == f"{rank} 2 gloo [0.0, 0.0, 1.0, 1.0]"


def _embed_worker(rank: int, init: str, out: str):
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=2)
    try:
        d = distributed.current()
        rows = np.arange(1, dtype=np.float32)  # one row on two ranks: rank 1's shard is empty

        def embed_rows(x, features=False):
            if len(x) == 0:  # as trainer.embed answers no rows: shapeless empty tensors
                return (torch.empty(0), torch.empty(0)) if features else torch.empty(0)
            e = torch.as_tensor(x)[:, None].repeat(1, 3) + 1.0
            return (e, e.double() * 2) if features else e

        emb = d.embed(embed_rows, rows)
        emb_f, feats = d.embed(lambda x: embed_rows(x, True), rows, features=True)
        torch.save({"emb": emb, "emb_f": emb_f, "feats": feats}, f"{out}.rank{rank}")
    finally:
        dist.destroy_process_group()


def test_an_empty_shard_gathers_the_others_rows(tmp_path):
    """Fewer rows than ranks: the rank with no rows still takes part, with a (0, D) block of the right dtype."""
    out = str(tmp_path / "embed")
    mp.spawn(_embed_worker, args=(tempfile.mktemp(dir=tmp_path), out), nprocs=2)
    for rank in range(2):
        got = torch.load(f"{out}.rank{rank}", weights_only=False)
        assert torch.equal(got["emb"], torch.ones(1, 3)) and torch.equal(got["emb_f"], torch.ones(1, 3))
        assert got["feats"].dtype == torch.float64 and torch.equal(got["feats"], torch.full((1, 3), 2.0, dtype=torch.float64))
