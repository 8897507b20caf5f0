"""DVC stage: train one method on one noisy dataset with one seed (runs/<dataset>/<noise>/<method>/seed<k>).

A killed run resumes from its last epoch's checkpoint when started again with the same params.
"""

from noisydml.cli import check_in_grid, run_stage
from noisydml.pipeline import train


def main() -> None:
    def args(p):
        p.add_argument("--dataset", required=True)
        p.add_argument("--noise", required=True)
        p.add_argument("--method", required=True)
        p.add_argument("--seed", type=int, required=True)

    def body(params, a):
        check_in_grid(params, dataset=a.dataset, noise=a.noise, method=a.method, seed=a.seed)
        train(params, a.dataset, a.noise, a.method, a.seed)

    run_stage(__doc__, args, body)


if __name__ == "__main__":
    main()
