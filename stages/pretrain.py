"""DVC stage: pretrain the backbone on the embedded source glyphs (data/pretrained), when train.pretrained is embedded."""

from noisydml.cli import run_stage

#: The params sections this stage loads (noisydml.cli; tests/test_dependencies.py checks them against dvc.yaml)
SECTIONS = ("pretrain", "train", "weights")


def _load():
    # imported here, not at the top: run_stage has pinned runtime.numerics before the numeric libraries load
    from noisydml.pipeline.pretrain import pretrain

    return lambda params, args: pretrain(params)


if __name__ == "__main__":
    run_stage(__doc__, lambda parser: None, _load, SECTIONS)
