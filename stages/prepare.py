"""DVC stage: prepare one dataset (data/prepared/<dataset>)."""

from noisydml.cli import check_in_grid, run_stage
from noisydml.pipeline import prepare


def main() -> None:
    def args(p):
        p.add_argument("--dataset", required=True)

    def body(params, a):
        check_in_grid(params, dataset=a.dataset)
        prepare(params, a.dataset)

    run_stage(__doc__, args, body)


if __name__ == "__main__":
    main()
