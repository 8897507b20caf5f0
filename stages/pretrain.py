"""DVC stage: pretrain the backbone on the embedded source glyphs (data/pretrained), when train.pretrained is embedded."""

from noisydml.cli import run_stage
from noisydml.pipeline.pretrain import pretrain

if __name__ == "__main__":
    run_stage(__doc__, lambda parser: None, lambda params, args: pretrain(params))
