"""How many passes BSPML's weight step (Alg. 3) needs: prints each pass's mean absolute weight change.

    python scripts/bspml_convergence.py runs/glyphs/sym50/bspml/seed0 [--passes 100] [--step-size 0.1]

From a trained run's final training embeddings (``train_embeddings.npz``: the noisy labels only, never the
truth) and its ``methods.bspml`` settings in ``params.yaml``: xi of Eq. 3, then Alg. 3 at the run's final age
(lambda_inf, in the run's unit) from two starts: all weights 1 (the first round's start) and the run's final
weights (a later round's start), with Eq. 8's sampled gradient and with its exact expectation. The sampled one
keeps moving at a constant step (its change falls to a floor and stays there); the exact one settles. Prints the
change at chosen passes and the passes to reach each tolerance: ``weight_step.passes`` (a maximum) must allow
them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from noisydml.config import read_params_file
from noisydml.methods.parts.bspml import ClassIndex, age_unit, maw_sdaw, weight_step, xi_negative, xi_positive
from noisydml.neighbours import similarity_blocks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a bspml run's folder (train_embeddings.npz, exports.npz)")
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--method", default="bspml")
    parser.add_argument("--passes", type=int, default=100)
    parser.add_argument("--step-size", type=float, default=None, help="default: the params' step_size")
    parser.add_argument("--gradient", choices=("sampled", "exact"), nargs="+", default=["sampled", "exact"])
    parser.add_argument("--tolerances", type=float, nargs="+", default=[1e-2, 3e-3, 1e-3, 1e-4, 1e-5])
    args = parser.parse_args()

    hp = read_params_file(args.params)["methods"][args.method]
    train = np.load(args.run / "train_embeddings.npz")
    emb, labels = train["embeddings"].astype(np.float32), train["labels"]
    index = ClassIndex.of(labels)
    loss, step = hp["loss"], hp["weight_step"]
    step_size = step["step_size"] if args.step_size is None else args.step_size
    unit = age_unit(hp["age_unit"], labels, loss["alpha"])
    lam = hp["lambda_inf"] * unit
    # as BSPMLMethod: spms has no mu (no balance term); bspml's mu is lambda_inf or a number in the age's unit
    mu = 0.0 if "mu" not in hp else lam if hp["mu"] == "lambda_inf" else float(hp["mu"]) * unit
    xi_pos = xi_positive(emb, index, loss["alpha"], loss["base"])
    xi_neg = xi_negative(emb, labels, loss["beta"], loss["base"], similarity_blocks)
    starts = {"ones": np.ones(len(labels))}
    exports = args.run / "exports.npz"
    if exports.exists():
        starts["run's final weights"] = np.load(exports)["weights"]
    print(f"{args.run}: {len(labels):,} rows, {len(index.present)} classes, age {lam:.3f} (lambda_inf "
          f"{hp['lambda_inf']} x unit {unit:.3f}), mu {mu:.3f}, step_size {step_size}, block {step['block']}")
    for gradient, (name, w0) in ((g, s) for g in args.gradient for s in starts.items()):
        trace: list[float] = []
        w = weight_step(w0, xi_pos, xi_neg, index, lam, mu, step_size, args.passes, step["classes"],
                        step["per_class"], step["block"], np.random.default_rng(0), trace=trace, gradient=gradient)
        shown = [p for p in (1, 2, 3, 5, 10, 20, 30, 50, 100, 200) if p <= len(trace)]
        print(f"  {gradient} gradient, from {name}: change per pass " + ", ".join(f"{p}: {trace[p - 1]:.4f}" for p in shown))
        reached = [f"{t:g}: {next((i + 1 for i, c in enumerate(trace) if c <= t), 'not within ' + str(args.passes))}"
                   for t in args.tolerances]
        print(f"    passes to reach each tolerance: {', '.join(reached)}; floor (median of the last 10): "
              f"{np.median(trace[-10:]):.4f}; MAW {maw_sdaw(w, labels)[0]:.3f}, weights at 0: {(w == 0).mean():.3f}, "
              f"at 1: {(w == 1).mean():.3f}")


if __name__ == "__main__":
    main()
