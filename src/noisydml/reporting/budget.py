"""What each row of the main table trained with: the epochs behind its final model and the images one step forwards,
so that a chained or multi-phase method is not read as better for what is only more training.

- **epochs behind the final model**: the run's own reported epoch (its ``selected_epoch``: the last, or the one
  model selection kept) plus, for a chained run that starts from its upstream's model (``chains.<key>.init.model``
  or ``init.method``), the upstream's, recursively; a chain that takes only labels or inputs from its upstream
  starts from the pretrained backbone, and the upstream's epochs are listed apart (``upstream epochs``);
- **images per step**: the sampler's batch (``train.batch``: classes x per class), times 1 + the positives a method
  forwards per sample (a method whose hyper-parameters say ``positive_source: forward`` forwards
  ``positives_per_sample`` more images per sample, from the epoch its subgroups start, ``sgm.start_epoch``); read
  from params, as the trainer runs them;
- **hyper-parameters**: tuned (the fair-tuning protocol, README "Tuning every method with the same budget") or as
  params.yaml sets them.
"""

from __future__ import annotations

import pandas as pd

from noisydml.runs import TUNED_SUFFIX


def _chain_of(params: dict, name: str, dataset: str, noise: str) -> dict | None:
    return next((c for c in params["chains"].values()
                 if (c["name"], c["dataset"], c["noise"]) == (name, dataset, noise)), None)


def epochs_behind(per_seed: pd.DataFrame, params: dict, name: str, dataset: str, noise: str,
                  seed: int) -> tuple[int, int]:
    """``(epochs behind the run's final model, epochs of upstream runs whose labels or inputs it used)``."""
    rows = per_seed[(per_seed["method"] == name) & (per_seed["dataset"] == dataset) & (per_seed["noise"] == noise)
                    & (per_seed["seed"] == seed)]
    own = int(rows["selected_epoch"].iloc[0]) if len(rows) and pd.notna(rows["selected_epoch"].iloc[0]) else 0
    chain = _chain_of(params, name.removesuffix(TUNED_SUFFIX), dataset, noise)
    if chain is None:
        return own, 0
    up_model, up_other = epochs_behind(per_seed, params, chain["upstream"], dataset, noise, seed)
    if chain["init"]["model"] or chain["init"]["method"]:
        return own + up_model, up_other
    return own, up_model + up_other


def images_per_step(params: dict, method: str) -> str:
    """The images one step forwards, from params (``64`` or ``64, 320 from epoch 5``)."""
    batch = params["train"]["batch"]["classes"] * params["train"]["batch"]["per_class"]
    hparams = params["methods"].get(method, {})
    if hparams.get("positive_source") == "forward" and hparams.get("positives_per_sample", 0) > 0:
        more = batch * (1 + int(hparams["positives_per_sample"]))
        start = int(hparams.get("sgm", {}).get("start_epoch", 0))
        return f"{more}" if start == 0 else f"{batch}, {more} from epoch {start + 1}"
    return f"{batch}"


def _method_of(params: dict, name: str, dataset: str, noise: str) -> str:
    chain = _chain_of(params, name.removesuffix(TUNED_SUFFIX), dataset, noise)
    return chain["method"] if chain else name.removesuffix(TUNED_SUFFIX)


def table(per_seed: pd.DataFrame, params: dict, rows: list[str], label) -> pd.DataFrame:
    """One line per row of the main table (its first setting that ran; the same in every setting of the default
    grid): its label, epochs behind its final model, upstream epochs used as labels/inputs, images per step, and
    how its hyper-parameters were set."""
    out = []
    for name in rows:
        runs = per_seed[per_seed["method"] == name]
        if runs.empty:
            continue
        first = runs.iloc[0]
        own, upstream = epochs_behind(per_seed, params, name, first["dataset"], first["noise"], int(first["seed"]))
        out.append({"row": label(name), "run": name, "epochs behind the final model": own,
                    "upstream epochs used as labels or inputs": upstream or "–",
                    "images per step": images_per_step(params, _method_of(params, name, first["dataset"],
                                                                           first["noise"])),
                    "hyper-parameters": "tuned on held-out classes" if name.endswith(TUNED_SUFFIX) else "params.yaml"})
    return pd.DataFrame(out)


def markdown(budget: pd.DataFrame) -> list[str]:
    if budget.empty:
        return []
    return ["### What each row trained with", "",
            "Epochs behind each row's final model (its own, plus its upstream's where it starts from the upstream's "
            "model), the epochs of an upstream it took only labels or inputs from, and the images one training step "
            "forwards (the sampler's batch; a method that forwards positives adds them). A row with more of either is "
            "not better for that alone: the equal-budget controls (params.yaml `chains`, labelled so) and their "
            "orderings below.", "",
            budget.drop(columns=["run"]).to_markdown(index=False), ""] + _tuned_note(budget)


def _tuned_note(budget: pd.DataFrame) -> list[str]:
    """Where a row was tuned and the row it would be compared with was not: said, so tuning is not read as method."""
    tuned = budget[budget["run"].str.endswith(TUNED_SUFFIX)]
    if tuned.empty:
        return []
    alone = [run for run in tuned["run"] if run.removesuffix(TUNED_SUFFIX) in set(budget["run"])]
    return [f"**Tuned rows** ({', '.join(tuned['row'])}): their hyper-parameters were searched on held-out training "
            "classes (README \"Tuning every method with the same budget\"); every other row keeps params.yaml's values, so a tuned row against an "
            "untuned baseline compares tuning as well as method: compare it with its baseline's tuned row "
            "(`tuning.methods`)" + (f"; the untuned rows of {len(alone)} of them are in the table too" if alone else "")
            + ".", ""]
