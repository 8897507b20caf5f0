"""BSPML's Figs. 3-4: MAW and SDAW (Eq. 14) over a (mu, lambda) grid, as heatmaps -> ``reports/bspml_maps/``.

The age is held constant per cell (``lambda_0 = lambda_inf = lambda``, ``age_multiplier = 1``) so that the axis
means one thing (spec §14 g). Each cell runs the weight step (Alg. 3) from all weights 1 for ``passes`` passes
on ``xi`` of one grid run's final model (its ``train_embeddings.npz``, noisy labels): the fixed-xi reading
(ours), seconds per map. The paper's reading retrains a model per cell (its figures use 20% per-class noise);
the weights here also say how far the weight step separates truly clean from truly noisy samples, from the
corrupt stage's ground truth stored with the embeddings.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from noisydml import io
from noisydml.methods.parts.bspml import ClassIndex, maw_sdaw, weight_step, xi_negative, xi_positive
from noisydml.neighbours import similarity_blocks
from noisydml.pipeline.layout import TRAIN_EMBEDDINGS, Layout


def bspml_map(params: dict, name: str, layout: Layout = Layout()) -> Path:
    from noisydml.schema import ParamsError
    from noisydml.studies import check_study

    maps = check_study(params, "bspml")["bspml_maps"]  # the study owns figures.bspml_maps
    if name not in maps:
        raise ParamsError(f"--name {name!r} is not an entry of figures.bspml_maps ({', '.join(maps) or 'none'})")
    entry = maps[name]
    hp = params["methods"][entry["method"]]
    run = layout.run(entry["dataset"], entry["noise"], entry["method"], entry["seed"])
    path = run / TRAIN_EMBEDDINGS
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; train the run first (dvc repro)")
    data = np.load(path)
    labels, noisy = data["labels"], data["labels"] != data["true_labels"]
    index = ClassIndex.of(labels)
    loss, step = hp["loss"], hp["weight_step"]
    xi_pos = xi_positive(data["embeddings"], index, loss["alpha"], loss["base"])
    xi_neg = xi_negative(data["embeddings"], labels, loss["beta"], loss["base"], similarity_blocks)
    rows = []
    for lam in entry["lambdas"]:
        for mu in entry["mus"]:
            w = weight_step(np.ones(len(labels)), xi_pos, xi_neg, index, lam, mu, step["step_size"],
                            entry["passes"], step["classes"], step["per_class"], step["block"],
                            np.random.default_rng([entry["seed"], 0xB5]), tolerance=step["tolerance"],
                            gradient=step["gradient"])
            maw, sdaw = maw_sdaw(w, labels)
            rows.append({"lambda": lam, "mu": mu, "maw": maw, "sdaw": sdaw,
                         "mean_weight_clean": float(w[~noisy].mean()) if (~noisy).any() else float("nan"),
                         "mean_weight_noisy": float(w[noisy].mean()) if noisy.any() else float("nan")})
    table = pd.DataFrame(rows)
    out = layout.reports / "bspml_maps"
    io.write_with(out / f"{name}.csv", lambda p: table.to_csv(p, index=False, float_format="%.6f"))
    from noisydml.reporting.plots import plot_grid_maps

    plot_grid_maps(table, f"{entry['method']} {entry['dataset']}/{entry['noise']} seed {entry['seed']}: xi of the "
                    f"final model, {entry['passes']} passes per cell", out / f"{name}.png")
    print(table.round(4).to_string(index=False))
    return out
