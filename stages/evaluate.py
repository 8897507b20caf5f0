"""DVC stage: retrieval metrics of one run on its test split (metrics/<dataset>/<noise>/<method>/seed<k>.json)."""

from noisydml.cli import check_in_grid, run_stage
from noisydml.pipeline import evaluate


def main() -> None:
    def args(p):
        p.add_argument("--dataset", required=True)
        p.add_argument("--noise", required=True)
        p.add_argument("--method", required=True)
        p.add_argument("--seed", type=int, required=True)

    def body(params, a):
        check_in_grid(params, dataset=a.dataset, noise=a.noise, method=a.method, seed=a.seed)
        evaluate(params, a.dataset, a.noise, a.method, a.seed)

    run_stage(__doc__, args, body)


if __name__ == "__main__":
    main()
