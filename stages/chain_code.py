"""DVC stage: a tuned chained run's lineage (its chains, their methods' hyper-parameters and code files, its search
space) -> code/chains/<dataset>-<noise>-<name>.json, which the tuned chain's stages depend on. Trains nothing.

--dataset D --noise N --chain C
    the chained run named C at D/N (tuning.chains)
"""

from noisydml.cli import run_stage

#: The params sections this stage loads (noisydml.cli; tests/test_dependencies.py checks them against dvc.yaml)
SECTIONS = ("methods", "chains", "tuning")


def _arguments(parser):
    for key in ("dataset", "noise", "chain"):
        parser.add_argument(f"--{key}", required=True)


def _load():
    from noisydml.pipeline.chain_code import write_chain_code

    def work(params, args):
        print(f"chain_code: {write_chain_code(params, args.dataset, args.noise, args.chain)}")

    return work


if __name__ == "__main__":
    run_stage(__doc__, _arguments, _load, SECTIONS)
