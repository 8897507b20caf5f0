"""Smooth Proxy-Anchor (Liu et al. 2020) as a study: its report section.

Phase 1 (``spa_confidence``, a grid run) trains a confidence module on the noisy labels; phase 2 (a chained run of
``spa_smooth_loss``) trains Proxy-Anchor with proxies selected by, and terms weighted by, phase 1's confidences.
The section scores phase 1's detection and relabelling and phase 2's use of them from ground truth the methods never
see, beside Proxy-Anchor's P@1 on the same frozen backbone.
"""

from __future__ import annotations

import pandas as pd

from noisydml import io
from noisydml.reporting.plots import plot_weight_histograms
from noisydml.runs import chain_runs
from noisydml.studies.base import Claim, ReportContext, Study, chain_run_value

#: The chained method of phase 2, and the grid methods its P@1 is shown beside.
PHASE2_METHOD = "spa_smooth_loss"
BASELINES = ("proxy_anchor_frozen", "proxy_anchor", "ms")
#: Chained runs its P@1 is shown beside where they ran: the equal-budget control (chains.proxy_anchor_frozen_continued_*).
CONTROLS = ("proxy_anchor_frozen_continued",)


def spa_table(params: dict, per_seed: pd.DataFrame) -> pd.DataFrame:
    """Smooth Proxy-Anchor, one row per chained phase-2 run (method ``spa_smooth_loss``) and seed: how phase 1's
    confidence module detects noisy labels (flagged = top-confidence class != given label; chance precision =
    the noise rate) and relabels (top class = true class), what phase 2 made of it (samples positive for no
    proxy, given labels dropped), and its P@1 beside Proxy-Anchor's on the same frozen backbone and MS's."""
    runs = per_seed.set_index(["dataset", "noise", "method", "seed"])
    label = lambda run: params["report"]["labels"].get(run, run)  # noqa: E731  (headings name runs as tables do)
    rows = []
    for c in (run.chain for run in chain_runs(params)):  # each entry at each of its seeds
        if c["method"] != PHASE2_METHOD:
            continue

        def value(name: str, column: str):
            v = chain_run_value(runs, c, name, column)
            return None if v is None or pd.isna(v) else float(v)

        up, name = c["upstream"], c["name"]
        coverage, kept = value(name, "final_diag_pseudo_label_coverage"), value(name, "final_diag_kept_fraction")
        rows.append({
            "dataset": c["dataset"], "noise": c["noise"], "seed": c["seed"],
            "noise rate": value(name, "actual_noise_rate"),
            "flag precision": value(up, "final_diag_flag_precision"),
            "flag recall": value(up, "final_diag_flag_recall"),
            "confidence AUROC": value(up, "final_diag_confidence_auroc"),
            "phase 1: relabelling accuracy": value(up, "final_diag_pseudo_label_accuracy"),
            "no positive proxy": None if coverage is None else 1 - coverage,
            "given label dropped": None if kept is None else 1 - kept,
            f"P@1 {label(name)}": value(name, "precision_at_1"),
            **{f"P@1 {label(m)}": value(m, "precision_at_1") for m in BASELINES
               if m in params["grid"]["methods"]},
            **{f"P@1 {label(m)}": value(m, "precision_at_1") for m in CONTROLS
               if (c["dataset"], c["noise"], m, c["seed"]) in runs.index},
        })
    return pd.DataFrame(rows)


def report(ctx: ReportContext) -> list[str]:
    params, per_seed = ctx.params, ctx.per_seed
    spa = spa_table(params, per_seed)
    md = ["## Smooth Proxy-Anchor", "",
          "Phase 1 (`spa_confidence`, a grid run) trains a confidence module on the noisy labels; phase 2 "
          "(`smooth_proxy_anchor`, a chained run) trains Proxy-Anchor with proxies selected by, and terms weighted "
          "by, phase 1's confidences; both on the frozen backbone, so `proxy_anchor_frozen` is its baseline. The "
          "loss, the smoothing and the relabelling are reconstructions (README \"The papers' benchmarks and tables\" links how). Per seed; phase 1: "
          "flagged = top-confidence class != given label (flag precision by chance = the noise rate), AUROC of "
          "the given label's confidence for clean vs noisy samples, relabelling accuracy = top class is the true "
          "class; phase 2: samples positive for no proxy, given labels below tau (dropped). Scores from ground "
          "truth the methods never see.", "",
          ctx.markdown(spa, shares=[c for c in spa.columns if c not in ("dataset", "noise", "seed")],
                       dash="not measured (no noisy sample, or the method not in the grid)") if not spa.empty
          else "(no smooth_proxy_anchor chain in params.yaml)", ""]
    if not spa.empty:
        md += [ctx.embed("spa_confidence_clean_noisy", "Confidences of clean and noisy samples"), ""]
        chains = [c for c in params["chains"].values() if c["method"] == PHASE2_METHOD]
        shown = {c["upstream"] for c in chains} | {c["name"] for c in chains}
        plot_weight_histograms(per_seed[per_seed["method"].isin(shown)], ctx.figure("spa_confidence_clean_noisy"),
                               column="histogram_confidence", xlabel="c(x, given label) (phase 1) / S(c) (phase 2)",
                               empty="", vector=True, labels=ctx.params["report"]["labels"],
                               noise_names=ctx.noise_names)
    io.write_with(ctx.out / "smooth_proxy_anchor.csv", lambda p: spa.to_csv(p, index=False, float_format="%.6f"))
    return md


STUDY = Study(name="smooth_proxy_anchor", title="Smooth Proxy-Anchor (2020)", report=report,
              claims=(Claim("smooth_proxy_anchor", "proxy_anchor_frozen",
                            "Smooth Proxy-Anchor above Proxy-Anchor on the same frozen backbone",
                            diagnostics=(("final_diag_weight_clean", "mean weight, clean"),
                                         ("final_diag_weight_noisy", "mean weight, noisy"),
                                         ("final_diag_pseudo_label_accuracy", "phase 2: relabelling accuracy"))),
                      # the same at an equal budget: 24 epochs on the frozen backbone behind both
                      # (chains.proxy_anchor_frozen_continued_*)
                      Claim("smooth_proxy_anchor", "proxy_anchor_frozen_continued",
                            "Smooth Proxy-Anchor above Proxy-Anchor at an equal budget (ours: 24 epochs each)",
                            diagnostics=(("final_diag_weight_clean", "mean weight, clean"),
                                         ("final_diag_weight_noisy", "mean weight, noisy"),
                                         ("final_diag_pseudo_label_accuracy", "phase 2: relabelling accuracy")))))
