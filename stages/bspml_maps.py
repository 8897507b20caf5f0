"""DVC stage: BSPML's MAW / SDAW maps over (mu, lambda) from one grid run (figures.bspml_maps.<name>)."""

from noisydml.cli import run_stage
from noisydml.pipeline.bspml_maps import bspml_map


def _args(parser):
    parser.add_argument("--name", required=True, help="an entry of figures.bspml_maps")


if __name__ == "__main__":
    run_stage(__doc__, _args, lambda params, args: bspml_map(params, args.name))
