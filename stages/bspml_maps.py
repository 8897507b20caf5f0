"""DVC stage: BSPML's MAW / SDAW maps over (mu, lambda) from one grid run (figures.bspml_maps.<name>)."""

from noisydml.cli import run_stage

#: The params sections this stage loads (noisydml.cli; tests/test_dependencies.py checks them against dvc.yaml)
SECTIONS = ("figures", "methods", "grid", "train", "evaluate")


def _args(parser):
    parser.add_argument("--name", required=True, help="an entry of figures.bspml_maps")


def _load():
    # imported here, not at the top: run_stage has pinned runtime.numerics before the numeric libraries load
    from noisydml.pipeline.bspml_maps import bspml_map

    return lambda params, args: bspml_map(params, args.name)


if __name__ == "__main__":
    run_stage(__doc__, _args, _load, SECTIONS)
