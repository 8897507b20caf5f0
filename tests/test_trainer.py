import copy

import numpy as np
import pytest
import torch

from noisydml.config import ParamsError, load_params
from noisydml.data import glyphs
from noisydml.engine.sampling import epoch_batches, steps_per_epoch
from noisydml.engine.types import ImageSet, RunSpec

PARAMS = load_params("params.yaml")
from noisydml.tools.check import check_all  # noqa: E402
from conftest import fit_job

PARAMS = check_all(PARAMS)


@pytest.fixture(scope="module")
def data():
    images, labels, _ = glyphs.generate(12, 6, 16, seed=0)
    train, test = labels < 6, labels >= 6
    return ImageSet(images[train], labels[train]), ImageSet(images[test], labels[test])


def _spec(method="mcl", epochs=3, hparams=None, **train):
    cfg = copy.deepcopy(PARAMS["train"])
    cfg.update({"epochs": epochs, "batch": {"classes": 3, "per_class": 2}, "backbone_width": 4, "embedding_dim": 8, **train})
    hp = copy.deepcopy(PARAMS["methods"][method])
    if method in ("mcl", "prism", "sgps"):
        hp["memory_size"] = 24
    hp.update(hparams or {})
    return RunSpec(method, hp, cfg, seed=5, data_fingerprint="test")


def _fit(spec, data, ckpt, **kw):
    return fit_job(spec, *data, checkpoint_path=ckpt, runtime={**PARAMS["runtime"], "progress": False}, **kw)


def test_batches_are_p_by_k_and_seeded():
    labels = np.repeat(np.arange(10), 5)
    a = epoch_batches(labels, per_class=2, batch_size=8, seed=1, epoch=0)
    assert all(len(b) == 8 for b in a) and len(a) == steps_per_epoch(len(labels), 8) == 6
    assert all(np.all(np.bincount(labels[b])[np.bincount(labels[b]) > 0] == 2) for b in a)
    assert all(np.array_equal(x, y) for x, y in zip(a, epoch_batches(labels, 2, 8, seed=1, epoch=0)))
    assert not all(np.array_equal(x, y) for x, y in zip(a, epoch_batches(labels, 2, 8, seed=1, epoch=1)))


def test_killed_run_resumes_to_the_same_result(data, tmp_path):
    spec = _spec()
    whole = _fit(spec, data, tmp_path / "a.pt")
    with pytest.raises(KeyboardInterrupt):
        _fit(spec, data, tmp_path / "b.pt", stop_after_epoch=1)
    assert (tmp_path / "b.pt").is_file()
    resumed = _fit(spec, data, tmp_path / "b.pt")
    assert resumed.resumed_from_epoch == 1
    assert [h["loss"] for h in resumed.history] == [h["loss"] for h in whole.history]
    assert torch.equal(resumed.test_embeddings, whole.test_embeddings)


def test_checkpoint_of_another_config_is_ignored(data, tmp_path, capsys):
    with pytest.raises(KeyboardInterrupt):
        _fit(_spec(), data, tmp_path / "c.pt", stop_after_epoch=1)
    other = _fit(_spec(optimizer={**PARAMS["train"]["optimizer"], "lr": 0.01, "weight_decay": 0.0}), data,
                 tmp_path / "c.pt")
    assert other.resumed_from_epoch is None
    assert "belongs to a different configuration" in capsys.readouterr().out


def test_history_has_loss_and_monitoring(data, tmp_path):
    result = _fit(_spec("ms", epochs=3, eval_every=2), data, tmp_path / "d.pt")
    assert [h["epoch"] for h in result.history] == [1, 2, 3]
    assert all(np.isfinite(row["loss"]) for row in result.history)
    # monitored every eval_every epochs and at the last epoch
    assert [("test_precision_at_1" in row) for row in result.history] == [False, True, True]
    assert all(0 <= row["test_precision_at_1"] <= 1 for row in result.history[1:])
    assert result.test_embeddings.shape == (36, 8)
    assert torch.allclose(result.test_embeddings.norm(dim=1), torch.ones(36), atol=1e-5)


def test_too_many_classes_per_batch(data, tmp_path):
    spec = _spec("ms", batch={"classes": 10, "per_class": 2})
    with pytest.raises(ParamsError, match="train.batch.classes: 10 classes per batch, but the training labels have only 6"):
        _fit(spec, data, tmp_path / "e.pt")


def test_best_validation_selects_on_held_out_classes_only(data, tmp_path):
    train, test = data
    held = np.isin(train.labels, [4, 5])
    fit = ImageSet(train.images[~held], train.labels[~held])
    val = ImageSet(train.images[held], train.labels[held])
    spec = _spec(method="ms", epochs=4, eval_every=1, validation_classes=2, model_selection="best_validation")
    result = _fit(spec, (fit, test), tmp_path / "v.pt", val_set=val)
    scores = [h["val_precision_at_1"] for h in result.history]
    assert result.selected_epoch == 1 + int(np.argmax(scores))  # first best epoch
    # the returned model is the selected epoch's: its test P@1 is what was monitored at that epoch
    from noisydml.evaluation.retrieval import retrieval_metrics

    p1 = retrieval_metrics(result.test_embeddings, test.labels, recall_at=(1,), nmi=False)["precision_at_1"]
    assert p1 == pytest.approx(result.history[result.selected_epoch - 1]["test_precision_at_1"])
    last = _fit(_spec(method="ms", epochs=4, eval_every=1, validation_classes=2), (fit, test), tmp_path / "l.pt",
                val_set=val)
    assert last.selected_epoch == 4 and "val_precision_at_1" in last.history[0]


def test_best_validation_without_validation_classes_is_refused(raw_params):
    from noisydml.tools.check import validate_all as validate_params

    raw_params["train"]["model_selection"] = "best_validation"
    with pytest.raises(ParamsError, match="needs train.validation_classes > 0"):
        validate_params(raw_params)
    raw_params["train"]["validation_classes"] = 190
    with pytest.raises(ParamsError, match="leaves fewer than train.batch.classes"):
        validate_params(raw_params)


@pytest.mark.parametrize("method, hparams", [
    ("mcl", {"memory_warmup_steps": 2}),                                   # XBM's queue engaged from step 2
    ("prism", {"memory_warmup_steps": 2, "warmup_steps": 2, "window": 4}),  # memory, centres and sTRM window engaged
    ("bspml", {"lambda_0": 0.5, "lambda_inf": 1.0, "age_multiplier": 1.5, "age_unit": "absolute",  # weights and age move
               "weight_step": {"step_size": 0.3, "passes": 2, "tolerance": 0.0, "gradient": "sampled", "classes": 2,
                               "per_class": 3, "block": 4}}),
    ("sgps", {"window": 4, "ppm": "transproto", "transproto": {"layers": 2, "heads": 2, "ffn_factor": 2,  # bank,
              "conditioning": 4}, "sgm": {"thresholds": "absolute", "lambda_max": 0.9, "lambda_min": 0.5,  # SGM
              "merge_min_similarity": 0.0, "meta_merge_similarity": 1.0, "tau_k_factor": 1.0, "tau_max_factor": 2.0,
              "cell_size_factor": 1.0, "neighbours": 8, "every_epochs": 1, "start_epoch": 1}}),  # labels and TransProto all move
])
def test_resume_is_bit_exact_with_engaged_memories(data, tmp_path, method, hparams):
    spec = _spec(method, epochs=4, hparams=hparams)
    steps_per = steps_per_epoch(len(data[0].labels), 6)
    assert steps_per * 1 > hparams.get("memory_warmup_steps", 0)  # the kill comes after the memory joined the loss
    whole = _fit(spec, data, tmp_path / "a.pt")
    with pytest.raises(KeyboardInterrupt):
        _fit(spec, data, tmp_path / "b.pt", stop_after_epoch=2)
    resumed = _fit(spec, data, tmp_path / "b.pt")
    assert resumed.resumed_from_epoch == 2
    assert resumed.history == whole.history
    assert torch.equal(resumed.test_embeddings, whole.test_embeddings)
    for key, value in whole.method.state_dict().items():
        other = resumed.method.state_dict()[key]
        assert torch.equal(value, other) if torch.is_tensor(value) else value == other, key
    if method == "mcl":
        assert whole.method.loss_fn.has_been_filled or whole.method.loss_fn.queue_idx > 0
    elif method == "sgps":
        assert int(whole.method.sgm_round) == 3 and (whole.method.drawn >= 0).any()
        assert whole.method.transproto is not None and whole.method.memory.rows.max() >= 0
        assert whole.history[-1]["sgps_anchors_with_positives"] > 0
    elif method == "bspml":
        assert int(whole.method.rounds) == 4 and float(whole.method.age) == 1.0
        w = whole.method.weights
        assert float(w.min()) >= 0 and float(w.max()) <= 1 and not torch.equal(w, torch.ones_like(w))
    else:
        assert int(whole.method.threshold.count) > 0 and int(whole.method.memory.class_counts.sum()) > 0


def test_decisions_are_scored_by_the_trainer_not_the_method(data, tmp_path):
    from noisydml.engine.judge import GroundTruth

    train, test = data
    noisy = np.zeros(len(train.labels), bool)
    noisy[::4] = True
    truth = GroundTruth(noisy, train.labels.copy(), np.ones(len(noisy), bool))
    spec = _spec("prism", epochs=2, hparams={"memory_warmup_steps": 0, "warmup_steps": 0})
    result = _fit(spec, data, tmp_path / "d.pt", truth=truth)
    assert {"diag_selection_precision", "diag_selection_recall", "diag_kept_fraction"} <= set(result.history[-1])
    assert "epoch_seconds" not in result.history[-1] and len(result.epoch_seconds) == 2
    plain = _fit(spec, data, tmp_path / "e.pt")  # without ground truth: the same training, no scores
    assert not any(k.startswith("diag_") for k in plain.history[-1])
    assert torch.equal(plain.test_embeddings, result.test_embeddings)
    assert set(result.exports) == {"keep", "keep_fraction"} and len(result.exports["keep"]) == len(train.labels)


def test_init_state_starts_from_another_runs_weights_and_resume_ignores_it(data, tmp_path):
    upstream = _fit(_spec("ms", epochs=1), data, tmp_path / "u.pt")
    init = {"model": upstream.model.state_dict(), "method": None}
    spec = _spec("ms", epochs=3)
    whole = _fit(spec, data, tmp_path / "a.pt", init_state=init)
    scratch = _fit(spec, data, tmp_path / "s.pt")
    assert not torch.equal(whole.test_embeddings, scratch.test_embeddings)
    with pytest.raises(KeyboardInterrupt):
        _fit(spec, data, tmp_path / "b.pt", init_state=init, stop_after_epoch=1)
    resumed = _fit(spec, data, tmp_path / "b.pt", init_state=init)
    assert resumed.resumed_from_epoch == 1 and torch.equal(resumed.test_embeddings, whole.test_embeddings)


def test_a_checkpoint_of_other_code_is_not_resumed(data, tmp_path, monkeypatch, capsys):
    import noisydml.engine.callbacks as callbacks

    with pytest.raises(KeyboardInterrupt):
        _fit(_spec("ms"), data, tmp_path / "c.pt", stop_after_epoch=1)
    monkeypatch.setattr(callbacks, "code_fingerprint", lambda *modules: "edited")
    result = _fit(_spec("ms"), data, tmp_path / "c.pt")
    assert result.resumed_from_epoch is None
    assert "the code changed since" in capsys.readouterr().out


def test_a_checkpoint_under_other_tracked_runtime_keys_is_not_resumed(data, tmp_path, capsys):
    """runtime.deterministic (like numerics, threads, amp, ...) changes what a run computes: a checkpoint made under
    another value is not resumed, and the message names the key."""
    with pytest.raises(KeyboardInterrupt):
        _fit(_spec("ms"), data, tmp_path / "r.pt", stop_after_epoch=1)
    result = fit_job(_spec("ms"), *data, checkpoint_path=tmp_path / "r.pt",
                     runtime={**PARAMS["runtime"], "progress": False, "deterministic": True})
    assert result.resumed_from_epoch is None
    assert "runtime.deterministic changed since" in capsys.readouterr().out


def test_the_resume_fingerprint_covers_the_runs_own_code_only():
    """A killed run's code is the stage's pipeline module and its method's module, with what they import: an edit
    of another method, the tuning code or the report leaves it resumable; its method's parts do not."""
    from noisydml.closure import module_closure

    files = {str(p).split("src/")[-1] for p in module_closure("noisydml.pipeline.train", "noisydml.methods.sgps")}
    assert {"noisydml/methods/sgps.py", "noisydml/methods/parts/sgps.py", "noisydml/methods/parts/prism.py",
            "noisydml/engine/trainer.py", "noisydml/pipeline/train.py"} <= files
    assert not files & {"noisydml/tuning.py", "noisydml/reporting/figures.py", "noisydml/tools/check.py",
                        "noisydml/methods/ms.py", "noisydml/methods/parts/bspml.py"}


COSINE_AFTER_WARMUP = [(1 + np.cos(np.pi * k / 8)) / 2 for k in (0, 1, 4, 7)]  # 8 steps after 4 of warm-up


@pytest.mark.parametrize("schedule, expected", [
    # 3 epochs x 4 steps; values at steps 0, 1, 2, 3, 4, 5, 8, 11
    ({"name": "cosine", "warmup_epochs": 1, "step_epochs": 10, "gamma": 0.1}, [0.25, 0.5, 0.75, 1.0] + COSINE_AFTER_WARMUP),
    ({"name": "step", "warmup_epochs": 0, "step_epochs": 1, "gamma": 0.5}, [1, 1, 1, 1, 0.5, 0.5, 0.25, 0.25]),
    ({"name": "constant", "warmup_epochs": 0, "step_epochs": 1, "gamma": 0.5}, [1.0] * 8),
    # DCQ's code: x gamma from each milestone epoch on (0-based); one past the run never applies
    ({"name": "multistep", "warmup_epochs": 0, "milestones": [1, 2, 9], "gamma": 0.1}, [1, 1, 1, 1, 0.1, 0.1, 0.01, 0.01]),
])
def test_lr_factor(schedule, expected):
    from noisydml.engine.optim import lr_factor

    factor = lr_factor(schedule, epochs=3, steps_per_epoch=4)
    assert np.allclose([factor(step) for step in (0, 1, 2, 3, 4, 5, 8, 11)], expected)


def test_warmup_hold_cosine_is_torchs_sequential_lr():
    """The SGPS authors' schedule: SequentialLR([LinearLR, CosineAnnealingLR], milestones) stepped per iteration."""
    from noisydml.engine.optim import lr_factor

    schedule = {**PARAMS["train"]["schedule"], "name": "warmup_hold_cosine", "warmup_steps": 10,
                "warmup_start_factor": 0.01, "cosine_from_step": 30, "cosine_steps": 40}
    factor = lr_factor(schedule, epochs=10, steps_per_epoch=10)
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    torch_schedule = torch.optim.lr_scheduler.SequentialLR(opt, [
        torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.01, total_iters=10),
        torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=40)], milestones=[30])
    theirs = []
    for _ in range(100):
        theirs.append(opt.param_groups[0]["lr"])
        opt.step()
        torch_schedule.step()
    assert np.allclose([factor(step) for step in range(100)], theirs, atol=1e-6)


@pytest.mark.parametrize("total", [7, 110, 149 * 100, 22510])
def test_fitted_warmup_hold_cosine_keeps_the_shape_and_ends_at_zero(total):
    """warmup_hold_cosine_fitted: the authors' shape (warm-up 1,000, hold to 3,000, cosine 8,000) scaled to the run,
    reaching 0 at its last step and never rising after its minimum, for runs shorter and longer than the design."""
    from noisydml.engine.optim import lr_factor

    schedule = {**PARAMS["train"]["schedule"], "name": "warmup_hold_cosine_fitted", "warmup_steps": 1000,
                "warmup_start_factor": 1e-6, "cosine_from_step": 3000, "cosine_steps": 8000}
    factor = lr_factor(schedule, epochs=1, steps_per_epoch=total)
    curve = np.array([factor(step) for step in range(total + 1)])
    assert curve[0] == pytest.approx(1e-6) or total < 11
    assert curve[total] == pytest.approx(0.0, abs=1e-12) and curve.max() == pytest.approx(1.0)
    low = int(np.argmin(curve[:total + 1]))
    assert low == total and np.all(np.diff(curve[int(np.argmax(curve)):]) <= 1e-12)
    if total > 1000:  # the shares of the design: peak reached at 1/11 of the run, cosine from 3/11
        assert np.argmax(curve) == pytest.approx(total / 11, abs=1)
        assert curve[int(total * 3 / 11) - 1] == 1.0 > curve[int(total * 3 / 11) + 2]


def test_betas_and_gradient_clipping_reach_the_optimiser(data, tmp_path):
    from noisydml.engine.optim import build_optimizer
    from noisydml.methods import build_method
    from noisydml.methods.base import MethodSetup

    opt_cfg = {**PARAMS["train"]["optimizer"], "name": "adamw", "betas": [0.9, 0.95]}
    layer = torch.nn.Linear(2, 2)
    method = build_method("ms", MethodSetup(PARAMS["methods"]["ms"], 2, 2, 4, np.arange(4) % 2, 0))
    opt = build_optimizer(layer, method, opt_cfg)
    assert isinstance(opt, torch.optim.AdamW) and opt.param_groups[0]["betas"] == (0.9, 0.95)
    # a run with clipping trains, and a killed one resumes to the same result
    spec = _spec("mcl", optimizer={**PARAMS["train"]["optimizer"], "grad_clip_norm": 0.01},
                 schedule={**PARAMS["train"]["schedule"], "name": "warmup_hold_cosine", "warmup_steps": 3,
                           "cosine_from_step": 5, "cosine_steps": 4})
    whole = _fit(spec, data, tmp_path / "a.pt")
    free = _fit(_spec("mcl", schedule=spec.train["schedule"]), data, tmp_path / "c.pt")
    assert [h["loss"] for h in whole.history] != [h["loss"] for h in free.history]  # clipping acts
    with pytest.raises(KeyboardInterrupt):
        _fit(spec, data, tmp_path / "b.pt", stop_after_epoch=1)
    resumed = _fit(spec, data, tmp_path / "b.pt")
    assert [h["loss"] for h in resumed.history] == [h["loss"] for h in whole.history]
    assert torch.equal(resumed.test_embeddings, whole.test_embeddings)


def test_proxies_weight_decay_factor_and_the_contrastive_baselines_authors_reduction():
    """proxy_weight_decay_factor: the proxies' group decays at factor x the optimiser's (0: the PRISM authors' proxy
    optimiser), the default leaves the group as before; contrastive's sum_over_batch = pml's pair terms summed / B."""
    from noisydml.engine.optim import build_optimizer
    from noisydml.methods import build_method, load_spec
    from noisydml.methods.base import MethodSetup

    labels = np.arange(8) % 4
    opt_cfg = {**PARAMS["train"]["optimizer"], "name": "adamw", "weight_decay": 5e-4}
    for factor, expected in ((0.0, 0.0), (1.0, 5e-4)):
        hparams = load_spec("proxynca").check({**PARAMS["methods"]["proxynca"], "proxy_weight_decay_factor": factor}, "x")
        method = build_method("proxynca", MethodSetup(hparams, 4, 3, 8, labels, 0))
        groups = build_optimizer(torch.nn.Linear(2, 3), method, opt_cfg).param_groups
        assert [g["weight_decay"] for g in groups] == [5e-4, expected]
        assert ("weight_decay" in method.param_groups(1.0, 5e-4)[0]) == (factor != 1.0)
    torch.manual_seed(0)
    embeddings = torch.nn.functional.normalize(torch.randn(8, 3), dim=1)
    values = {}
    for reduction in ("pair_means", "sum_over_batch"):
        hparams = load_spec("contrastive").check({"loss": {"pos_margin": 1.0, "neg_margin": 0.5},
                                                  "reduction": reduction}, "x")
        method = build_method("contrastive", MethodSetup(hparams, 4, 3, 8, labels, 0))
        values[reduction] = float(method.loss_of(embeddings, torch.as_tensor(labels), 0))
    sim = embeddings @ embeddings.T
    same = torch.as_tensor(labels)[:, None] == torch.as_tensor(labels)[None, :]
    off = ~torch.eye(8, dtype=torch.bool)
    by_hand = ((1 - sim)[same & off].clamp(min=0).sum() + (sim - 0.5)[~same].clamp(min=0).sum()) / 8
    assert values["sum_over_batch"] == pytest.approx(float(by_hand), rel=1e-5)
    assert values["pair_means"] != pytest.approx(values["sum_over_batch"])


def test_test_checks_between_steps_feed_only_the_test_selected_figure(data, tmp_path):
    """train.test_check_every_steps: a test P@1 every N steps, the epoch's best in its history row; the run trains
    bit for bit as without the checks (they select nothing and draw nothing), and collect's [best on test] is the
    highest of the epoch curve and the checks."""
    plain = _fit(_spec("mcl", eval_every=1), data, tmp_path / "a.pt")
    checked = _fit(_spec("mcl", eval_every=1, test_check_every_steps=1), data, tmp_path / "b.pt")
    assert torch.equal(plain.test_embeddings, checked.test_embeddings)
    assert [h["loss"] for h in plain.history] == [h["loss"] for h in checked.history]
    checks = [h["test_check_precision_at_1"] for h in checked.history]
    assert all(0.0 <= c <= 1.0 for c in checks) and "test_check_precision_at_1" not in plain.history[0]
    # the check after an epoch's last step sees the model the epoch-end monitor sees
    assert all(c >= h["test_precision_at_1"] - 1e-12 for c, h in zip(checks, checked.history))


def test_frozen_batchnorm_stays_frozen_through_training(data, tmp_path):
    """train.frozen_bn: running statistics *and* affine parameters keep their values, whatever a method's
    per-epoch choice of trainable parts re-enables (before the fix the affine parameters trained)."""
    spec = _spec("ms", epochs=2, frozen_bn=True)
    torch.manual_seed(spec.seed)
    from noisydml.models import build_model

    start = {k: v.clone() for k, v in build_model(spec.train, in_channels=1).state_dict().items()}
    result = _fit(spec, data, tmp_path / "bn.pt")
    norms = [name for name, m in result.model.backbone.named_modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert norms
    trained = result.model.state_dict()
    for name in norms:
        for what in ("weight", "bias", "running_mean", "running_var"):
            key = f"backbone.{name}.{what}"
            assert torch.equal(trained[key], start[key]), key
    assert not torch.equal(trained["head.weight"], start["head.weight"])  # the rest trained


class _SlowlyOpenedRun:
    """A tracker whose MLflow run opens in the background and is not open yet when the first epoch ends (the
    real one takes about 3 s of CPU; an epoch of the default run about 1 s)."""

    def __init__(self):
        self.opened_with, self._id = [], None

    def start(self, run_id=None):
        self.opened_with.append(run_id)

    @property
    def run_id(self):  # the real tracker's property waits for the background open
        self._id = self._id or f"run{len(self.opened_with)}"
        return self._id

    def log_metrics(self, metrics, step):
        pass

    def end(self, status="FINISHED"):
        pass


def test_a_run_killed_before_its_tracking_run_opened_resumes_the_same_tracking_run(data, tmp_path):
    """The first checkpoint waits for the tracker's run id: a run killed after epoch 1 continues its MLflow run
    instead of starting a second one (seen with two processes on one core)."""
    spec, first = _spec(), _SlowlyOpenedRun()
    with pytest.raises(KeyboardInterrupt):
        fit_job(spec, *data, checkpoint_path=tmp_path / "e.pt", tracker=first, stop_after_epoch=1,
                runtime={**PARAMS["runtime"], "progress": False})
    second = _SlowlyOpenedRun()
    fit_job(spec, *data, checkpoint_path=tmp_path / "e.pt", tracker=second,
            runtime={**PARAMS["runtime"], "progress": False})
    assert first.opened_with == [None] and second.opened_with == ["run1"]
