"""A corpus of the mistakes a user makes in params.yaml: each refused alone with its key, its value, what is
allowed and (where there is one) a near miss of the same kind; all of them at once in one batch, every one listed.

Each mistake is a ``-S`` override, applied with DVC's own code (:func:`noisydml.tools.overrides.apply`, on a copy)
and validated whole (:func:`noisydml.tools.check.validate_all`), as ``noisydml launch -S`` does.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from noisydml.tools.check import validate_all
from noisydml.tools.overrides import apply
from noisydml.schema import MAX_ERRORS, ParamsError, messages_of

REPO = Path(__file__).resolve().parents[1]

# (override, the key the message names, what the message must also say: value, allowed values, a near miss)
CORPUS = [
    ("train.epochs=-1", "train.epochs", ["-1", "minimum 1"]),
    ("train.batch.classes=0", "train.batch.classes", ["0", "minimum 2"]),
    ("train.batch.per_class=1", "train.batch.per_class", ["1", "minimum"]),
    ("train.optimizer.name=adamw2", "train.optimizer.name", ["'adamw2'", "did you mean 'adamw'", "adam, adamw, sgd"]),
    ("train.optimizer.lr=fast", "train.optimizer.lr", ["'fast'", "float"]),
    ("train.schedule.name=cosin", "train.schedule.name", ["'cosin'", "did you mean 'cosine'", "multistep"]),
    ("train.input.crop=0", "train.input.crop", ["0", "minimum"]),
    ("train.backbone=resnet34", "train.backbone", ["'resnet34'", "resnet18", "(image retrieval)"]),
    ("train.backbone=iresnet35", "train.backbone", ["did you mean 'iresnet", "(face recognition"]),
    ("train.embedding_dim=0", "train.embedding_dim", ["0", "minimum"]),
    ("train.pretrained=imagenet2", "train.pretrained", ["'imagenet2'", "did you mean 'imagenet'", "embedded"]),
    ("train.validation_classes=-3", "train.validation_classes", ["-3", "minimum"]),
    ("+train.epoch=3", "train", ["unknown key 'epoch'", "did you mean 'epochs'"]),
    ("runtime.numerics=portble", "runtime.numerics", ["'portble'", "did you mean 'portable'", "native"]),
    ("runtime.threads=-2", "runtime.threads", ["-2", "minimum 0"]),
    ("runtime.device=gpu", "runtime.device", ["'gpu'", "auto, cpu, cuda"]),
    ("runtime.processes=0", "runtime.processes", ["0", "minimum"]),
    ("grid.noises=[sym30]", "grid.noises[0]", ["'sym30'", "+noise.sym30={kind: symmetric, rate: 0.3"]),
    ("grid.methods=[prsim]", "grid.methods[0]", ["'prsim'", "did you mean 'prism'"]),
    ("grid.datasets=[glyph]", "grid.datasets[0]", ["'glyph'", "did you mean 'glyphs'"]),
    ("grid.seeds=[0,0]", "grid.seeds", ["listed twice"]),
    ("grid.methods=[]", "grid.methods", ["at least one"]),
    ("noise.sym50.rate=50", "noise.sym50.rate", ["50", "maximum", "write 0.5 for 50%"]),
    ("noise.sym50.kind=symetric", "noise.sym50.kind", ["'symetric'", "did you mean 'symmetric'"]),
    ("+noise.sym50.rat=0.5", "noise.sym50", ["unknown key 'rat'", "did you mean 'rate'"]),
    ("methods.prism.noise_rate=2.0", "methods.prism.noise_rate", ["2.0", "maximum"]),
    ("+methods.ms.alpha=2", "methods.ms", ["unknown key 'alpha'", "allowed keys"]),
    ("report.metrics=[precision_at_2]", "report.metrics[0]", ["'precision_at_2'", "did you mean 'precision_at_1'"]),
    ("chains.smooth_proxy_anchor_clean.labels.keep=kep", "chains.smooth_proxy_anchor_clean.labels.keep",
     ["'kep'", "confidence_values"]),
    ("chains.smooth_proxy_anchor_sym50.inputs=[confidence_clases]", "chains.smooth_proxy_anchor_sym50.inputs[0]",
     ["did you mean 'confidence_classes'"]),
    ("chains.smooth_proxy_anchor_sc50.upstream=spa_confidenc", "chains.smooth_proxy_anchor_sc50.upstream",
     ["did you mean 'spa_confidence'"]),
    ("tuning.methods=[prsim]", "tuning.methods[0]", ["unknown method 'prsim'", "did you mean 'prism'",
                                                     "entries of the `methods` section"]),
    ("evaluate.max_k=0", "evaluate.max_k", ["0", "minimum"]),
    ("tracking.experiment=3", "tracking.experiment", ["3", "str"]),
    ("datasets.glyphs.kind=glyph", "datasets.glyphs.kind", ["'glyph'", "did you mean 'glyphs'"]),
    ("+datasets.glyphs.classes_=3", "datasets.glyphs", ["unknown key 'classes_'"]),
    ("+figures.colour=red", "figures", ["unknown section 'colour'", "sgps_ablations"]),
]


@pytest.mark.parametrize("override,key,says", CORPUS, ids=[c[0] for c in CORPUS])
def test_a_single_mistake_is_refused_with_its_key_value_allowed_and_near_miss(override, key, says):
    edit = apply(REPO / "params.yaml", [override])
    with pytest.raises(ParamsError) as refused:
        validate_all(edit.data)
    messages = messages_of(refused.value)
    mine = [m for m in messages if m.startswith(f"{key}:") or m.startswith(f"{key} ")]
    assert mine, messages
    for text in says:
        assert any(text in m for m in mine), (text, mine)
    said = " ".join(mine)
    assert "allowed" in said or "expected" in said or "define it" in said or "listed twice" in said, mine


@pytest.mark.parametrize("override,key,near", [
    ("+report.labels.prsim=PRISM", "report.labels", "did you mean 'prism'"),
    ("report.panels.baselines=[ms,prsim]", "report.panels.baselines[1]", "did you mean 'prism'"),
    ("+report.reference_rows.spa_confidenc=x", "report.reference_rows", "did you mean 'spa_confidence'")])
def test_a_report_name_of_no_run_is_said_with_its_near_miss_and_not_refused(override, key, near):
    """A label or panel entry for a run this configuration does not define is kept (a profile's chain, a chain
    dropped here) but said by `noisydml check` and the launcher: a typo labels nothing."""
    from noisydml.tools.check import report_name_warnings

    edit = apply(REPO / "params.yaml", [override])
    warnings = report_name_warnings(validate_all(edit.data))
    assert [w for w in warnings if w.startswith(f"{key}:") and near in w], warnings
    assert report_name_warnings(validate_all(apply(REPO / "params.yaml", []).data)) == []


def test_every_mistake_of_a_batch_is_listed_whatever_section_fails():
    """One mistake per key above at once (one of each conflicting pair): every one is listed, train's included
    while runtime, weights and the rest fail too (it was the first train error only, none when runtime failed)."""
    batch, keys = [], []
    for override, key, _ in CORPUS:
        root = override.lstrip("+").split("=")[0]
        if any(root.split(".")[:2] == b.lstrip("+").split("=")[0].split(".")[:2] for b in batch):
            continue  # two mistakes in one value: the first is the one written
        batch.append(override)
        keys.append(key)
    assert len(batch) >= 30
    edit = apply(REPO / "params.yaml", batch)
    with pytest.raises(ParamsError) as refused:
        validate_all(edit.data)
    messages = messages_of(refused.value)
    missing = [key for key in keys if not any(m.startswith(f"{key}:") for m in messages)]
    # a section whose needed section failed is not checked (tuning needs train; noise_runs needs noise):
    # their mistakes are listed once that one is mended; everything else must be here
    # and a chain's upstream is judged against grid.methods, which has a mistake here
    assert not [k for k in missing if not k.startswith("tuning.") and not k.endswith(".upstream")], (missing, messages)
    assert len(messages) > MAX_ERRORS or "problems" in str(refused.value)


def test_train_lists_every_mistake_of_its_own_and_of_its_sub_sections():
    edit = apply(REPO / "params.yaml", ["train.epochs=-1", "train.optimizer.name=adamw2", "train.batch.classes=0",
                                        "train.input.crop=0", "runtime.numerics=portble"])
    with pytest.raises(ParamsError) as refused:
        validate_all(edit.data)
    said = " ".join(messages_of(refused.value))
    for key in ("train.epochs", "train.optimizer.name", "train.batch.classes", "train.input.crop", "runtime.numerics"):
        assert f"{key}:" in said, said
