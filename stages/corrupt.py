"""DVC stage: inject one noise setting into one dataset's training labels (data/noisy/<dataset>/<noise>)."""

from noisydml.cli import check_in_grid, run_stage
from noisydml.pipeline import corrupt


def main() -> None:
    def args(p):
        p.add_argument("--dataset", required=True)
        p.add_argument("--noise", required=True)

    def body(params, a):
        check_in_grid(params, dataset=a.dataset, noise=a.noise)
        corrupt(params, a.dataset, a.noise)

    run_stage(__doc__, args, body)


if __name__ == "__main__":
    main()
