import numpy as np
import pytest
import torch

from conftest import FakeServices, batch_of
from noisydml.config import load_params
from noisydml.engine.optim import build_optimizer
from noisydml.methods import build_method, method_names
from noisydml.methods.base import MethodSetup
from noisydml.tools.check import check_all

PARAMS = check_all(load_params("params.yaml"))


class _TinyNetwork(torch.nn.Module):
    """A second network for methods that own one (its features are the batch's, moved by a linear map)."""

    def __init__(self):
        super().__init__()
        self.backbone = torch.nn.Linear(16, 16)
        self.head = torch.nn.Linear(16, 16)

    def forward_with_features(self, x):
        features = self.backbone(x)
        return torch.nn.functional.normalize(self.head(features), dim=1), features


def _setup(name, num_classes=4):
    labels = np.repeat(np.arange(num_classes), 8)
    # what a chained smooth_proxy_anchor run gets from its phase 1: certain of the given labels
    inputs = {"confidence_classes": labels[:, None], "confidence_values": np.ones((len(labels), 1), np.float32),
              "confidence_label": labels}
    return MethodSetup(PARAMS["methods"][name], num_classes, 16, len(labels), labels, seed=0, feature_dim=16,
                       inputs=inputs, services=FakeServices(_TinyNetwork))


@pytest.mark.parametrize("step", [0, 100_000], ids=["first-step", "past-every-warm-up"])
@pytest.mark.parametrize("name", method_names())
def test_every_method_gives_a_finite_differentiable_loss(name, step):
    """At step 0 (inside every warm-up) and far past them (memories, selection, proxies all engaged)."""
    torch.manual_seed(0)
    method = build_method(name, _setup(name))
    labels = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3])
    # spa_confidence (Smooth Proxy-Anchor's phase 1) trains a confidence module on the backbone features only, the
    # classification baselines a classifier on them
    on_features = name == "spa_confidence" or method.retrieval == "features"
    # a few batches, so cross-batch memories hold earlier ones (dcq_skh: its 3 queues are empty, and win at loss 0,
    # until each has had a batch's keys)
    for i in range(4):
        emb = torch.nn.functional.normalize(torch.randn(16, 16) + torch.eye(16)[labels] * 2, dim=1).requires_grad_()
        features = emb.detach().clone().requires_grad_() if on_features else None
        batch = batch_of(emb, labels, step=step + i, features=features)
        inputs = emb.detach() + 0.1 * torch.randn(16, 16)
        method.setup.services.forward_with = lambda net, x=inputs: net.forward_with_features(x)
        loss, logs = method.loss(batch)
        assert loss.ndim == 0 and torch.isfinite(loss)
        loss.backward()
        grad = features.grad if on_features else emb.grad
        assert grad is not None and torch.isfinite(grad).all()
        assert isinstance(logs, dict)
    assert grad.abs().sum() > 0, "the loss must depend on the embeddings (phase 1: on the features)"


@pytest.mark.parametrize("name", ["proxy_anchor", "softtriple", "proxynca", "normalized_softmax", "margin"])
def test_methods_with_parameters_put_them_in_the_optimizer(name):
    method = build_method(name, _setup(name))
    model = torch.nn.Linear(2, 2)
    opt = build_optimizer(model, method, PARAMS["train"]["optimizer"])
    assert len(opt.param_groups) == 2
    owned = {id(p) for p in method.parameters()}
    assert owned and owned == {id(p) for p in opt.param_groups[1]["params"]}
    assert opt.param_groups[1]["lr"] == pytest.approx(PARAMS["train"]["optimizer"]["lr"] * method.lr_multiplier())


def test_cross_batch_memory_starts_after_its_warmup():
    # the from-scratch regime's warm-up (the default, pretrained, is 0: the memory fills from step 0)
    warmup = 300
    method = build_method("mcl", MethodSetup({**PARAMS["methods"]["mcl"], "memory_warmup_steps": warmup}, 4, 16, 32,
                                             np.repeat(np.arange(4), 8), seed=0))
    emb = torch.nn.functional.normalize(torch.randn(8, 16), dim=1)
    labels = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    method.loss(batch_of(emb, labels, step=warmup - 1))
    assert method.loss_fn.queue_idx == 0 and not method.loss_fn.has_been_filled
    method.loss(batch_of(emb, labels, step=warmup))
    assert method.loss_fn.queue_idx == 8


def test_cross_batch_memory_state_survives_a_checkpoint():
    method = build_method("mcl", _setup("mcl"))
    emb = torch.nn.functional.normalize(torch.randn(8, 16), dim=1)
    method.loss(batch_of(emb, torch.tensor([0, 0, 1, 1, 2, 2, 3, 3]), step=10_000))  # after the warm-up
    state = method.state_dict()
    fresh = build_method("mcl", _setup("mcl"))
    fresh.load_state_dict(state)
    assert fresh.loss_fn.queue_idx == 8
    assert torch.equal(fresh.loss_fn.embedding_memory[:8], emb)
