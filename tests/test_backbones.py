"""The papers' backbones: BN-Inception in its published key layout, ResNet-50 V1, pooling, frozen batch norm,
the Caffe input normalisation, and published weights fetched by the pretrain stage (local server)."""

import copy
import hashlib
import io as _io

import pytest
import torch
from PIL import Image

from noisydml.data.download import DownloadError
from noisydml.models import BACKBONES, GlobalPool, build_model, load_backbone_weights
from noisydml.tools.check import validate_all
from noisydml.pipeline.layout import Layout
from noisydml.pipeline.pretrain import pretrain
from noisydml.pipeline.pretrained import load_pretrained

#: The key layout of pretrainedmodels' bn_inception-52deb4733.pth, written out by module (conv + its _bn).
STEM = ["conv1_7x7_s2", "conv2_3x3_reduce", "conv2_3x3"]
BRANCHES = ["1x1", "3x3_reduce", "3x3", "double_3x3_reduce", "double_3x3_1", "double_3x3_2", "pool_proj"]
STRIDED = ["3x3_reduce", "3x3", "double_3x3_reduce", "double_3x3_1", "double_3x3_2"]  # 3c, 4e: no 1x1, no proj
PUBLISHED_CONVS = STEM + [f"inception_{m}_{b}" for m in ("3a", "3b", "4a", "4b", "4c", "4d", "5a", "5b")
                          for b in BRANCHES] + [f"inception_{m}_{b}" for m in ("3c", "4e") for b in STRIDED]


def published_layout_state(seed=0) -> dict:
    """A randomly initialised BN-Inception state dict saved as the published file has it: conv weight + bias,
    bn weight/bias/running_mean/running_var (no num_batches_tracked: an old PyTorch's file), last_linear."""
    torch.manual_seed(seed)
    net = BACKBONES["bn_inception"](3, {"pooling": "max"})
    state = {k: v.clone() for k, v in net.state_dict().items() if not k.endswith("num_batches_tracked")}
    for k in state:
        if k.endswith("running_var"):
            state[k] = torch.rand_like(state[k]) + 0.5
        elif k.endswith("running_mean"):
            state[k] = torch.randn_like(state[k]) * 0.1
    return state


def test_bn_inception_has_the_published_key_layout_and_shapes():
    state = BACKBONES["bn_inception"](3, {"pooling": "max"}).state_dict()
    expected = {f"{c}.{p}" for c in PUBLISHED_CONVS for p in ("weight", "bias")}
    expected |= {f"{c}_bn.{p}" for c in PUBLISHED_CONVS
                 for p in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")}
    expected |= {"last_linear.weight", "last_linear.bias"}
    assert set(state) == expected
    shapes = {"conv1_7x7_s2.weight": (64, 3, 7, 7), "inception_3a_pool_proj.weight": (32, 192, 1, 1),
              "inception_3c_3x3.weight": (160, 128, 3, 3), "inception_4e_double_3x3_2.weight": (256, 256, 3, 3),
              "inception_5a_1x1.weight": (352, 1056, 1, 1), "inception_5b_pool_proj.weight": (128, 1024, 1, 1),
              "last_linear.weight": (1000, 1024)}
    for key, shape in shapes.items():
        assert tuple(state[key].shape) == shape, key


@pytest.mark.parametrize("backbone,dim,pooling", [("bn_inception", 512, "max"), ("resnet50", 128, "avg+max")])
def test_paper_backbones_forward_and_backward_on_224(backbone, dim, pooling):
    torch.manual_seed(0)
    model = build_model({"backbone": backbone, "backbone_width": 16, "pretrained": "none", "pooling": pooling,
                         "frozen_bn": False, "embedding_dim": dim}, in_channels=3)
    x = torch.randn(2, 3, 224, 224)
    out = model(x)
    assert out.shape == (2, dim) and torch.allclose(out.norm(dim=1), torch.ones(2), atol=1e-5)
    out.sum().backward()
    # every parameter but the ImageNet classifier (kept only so the published file loads) gets a gradient
    grads = [p.grad for n, p in model.named_parameters() if p.requires_grad and "last_linear" not in n]
    assert all(g is not None for g in grads) and any(g.abs().sum() > 0 for g in grads)
    assert model.backbone.out_dim == (1024 if backbone == "bn_inception" else 2048)


def test_published_state_dicts_load():
    net = BACKBONES["bn_inception"](3, {"pooling": "max"})
    state = published_layout_state()
    load_backbone_weights(net, state, "test")
    assert torch.equal(net.state_dict()["inception_4d_3x3.weight"], state["inception_4d_3x3.weight"])
    import torchvision

    torch.manual_seed(1)
    published = torchvision.models.resnet50(weights=None).state_dict()  # torchvision's layout, fc included
    resnet = BACKBONES["resnet50"](3, {"pooling": "avg", "pretrained": "none"})
    load_backbone_weights(resnet, published, "test")
    assert torch.equal(resnet.state_dict()["layer4.2.conv3.weight"], published["layer4.2.conv3.weight"])
    broken = dict(state)
    del broken["inception_5b_pool_proj_bn.running_var"]
    with pytest.raises(ValueError, match="inception_5b_pool_proj_bn.running_var"):
        load_backbone_weights(BACKBONES["bn_inception"](3, {"pooling": "max"}), broken, "test")


def test_pooling_and_frozen_batch_norm():
    x = torch.randn(2, 4, 5, 5)
    assert torch.allclose(GlobalPool("avg+max")(x), GlobalPool("avg")(x) + GlobalPool("max")(x))
    model = build_model({"backbone": "small_cnn", "backbone_width": 4, "pretrained": "none", "pooling": "avg",
                         "frozen_bn": True, "embedding_dim": 8}, in_channels=1)
    model.train()
    norms = [m for m in model.backbone.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert norms and all(not m.training for m in norms) and model.head.training
    assert all(not p.requires_grad for m in norms for p in m.parameters())
    before = norms[0].running_mean.clone()
    model(torch.randn(4, 1, 16, 16))
    assert torch.equal(norms[0].running_mean, before)


def test_caffe_bgr_normalisation():
    from noisydml.data.images import input_transform

    cfg = {"backbone": "bn_inception", "pretrained": "bn_inception_imagenet",
           "input": {"crop": 8, "resize": 8, "scale_min": 1.0, "flip": False, "augment": False,
                     "normalisation": "auto"}}
    transform = input_transform(cfg).build(train=False)
    out = transform(Image.new("RGB", (8, 8), (255, 0, 0)))
    assert torch.allclose(out[:, 0, 0], torch.tensor([0 - 104.0, 0 - 117.0, 255 - 128.0]), atol=1e-3)


def _params(raw_params, url, sha):
    raw = copy.deepcopy(raw_params)
    raw["train"].update(backbone="bn_inception", pretrained="bn_inception_imagenet", pooling="max",
                        embedding_dim=512)
    raw["weights"]["bn_inception_imagenet"].update(url=url, sha256=sha)
    raw["runtime"]["progress"] = False
    return validate_all(raw)


def test_pretrain_stage_fetches_checks_and_stores_published_weights(tmp_path, raw_params, local_server):
    base, served = local_server
    buffer = _io.BytesIO()
    state = published_layout_state()
    torch.save(state, buffer)
    data = buffer.getvalue()
    sha = hashlib.sha256(data).hexdigest()
    served.files["/bn_inception-test.pth"] = data
    layout = Layout(tmp_path)
    params = _params(raw_params, f"{base}/bn_inception-test.pth", sha[:9])  # a prefix, as the file name gives it
    card = pretrain(params, layout)
    assert card["file_sha256"] == sha and card["ignored_keys"] == [] and card["tensors"] == 485
    loaded, record = load_pretrained(params, layout)
    model = build_model(params["train"], in_channels=3)
    load_backbone_weights(model.backbone, loaded, "test")
    assert torch.equal(model.backbone.state_dict()["inception_3b_double_3x3_1.weight"],
                       state["inception_3b_double_3x3_1.weight"])
    assert record["source"] == "bn_inception_imagenet"
    # a second run uses the downloaded file (no request)
    requests = len(served.log)
    pretrain(params, layout)
    assert len(served.log) == requests


def test_weights_with_a_wrong_sha256_are_refused_and_deleted(tmp_path, raw_params, local_server):
    base, served = local_server
    served.files["/bn_inception-test.pth"] = b"not the weights"
    layout = Layout(tmp_path)
    with pytest.raises(DownloadError, match="sha256 mismatch: expected 52deb4733"):
        pretrain(_params(raw_params, f"{base}/bn_inception-test.pth", "52deb4733"), layout)
    assert not (layout.raw("weights") / "bn_inception-test.pth").exists()
    assert not layout.pretrained.exists()


def test_weights_for_another_backbone_are_refused(raw_params):
    from noisydml.schema import ParamsError

    raw = copy.deepcopy(raw_params)
    raw["train"].update(backbone="resnet50", pretrained="bn_inception_imagenet")
    with pytest.raises(ParamsError, match="weights 'bn_inception_imagenet' are for backbone 'bn_inception'"):
        validate_all(raw)
