"""``margin``: a pytorch-metric-learning baseline (:class:`noisydml.methods.parts.pml.PMLBaseline`)."""

from pytorch_metric_learning import losses, miners

from noisydml.methods.parts.pml import PMLBaseline, baseline_spec

SPEC = baseline_spec(PMLBaseline(
    losses.MarginLoss, {"margin": 0.2, "nu": 0.0, "beta": 1.2, "learn_beta": True},
    "margin loss with learned beta + distance-weighted sampling (Wu et al. 2017)",
    needs=("num_classes",), miner_cls=miners.DistanceWeightedMiner,
    miner_defaults={"cutoff": 0.5, "nonzero_loss_cutoff": 1.4},
))
