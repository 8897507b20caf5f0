"""DVC stage (opt-in): seconds per training epoch of one timing.entries method (timing/<entry>.json)."""

from noisydml.cli import run_stage
from noisydml.pipeline.timing import timing

if __name__ == "__main__":
    run_stage(__doc__, lambda parser: parser.add_argument("--entry", required=True),
              lambda params, args: timing(params, args.entry))
