"""noisydml.engine.eager_optim: torch.optim's numbers, bit for bit, without importing torch._dynamo."""

import subprocess
import sys
import textwrap

from conftest import REPO

CODE = textwrap.dedent("""
    import sys
    import torch
    from noisydml.engine.eager_optim import eager

    def train(cls, **options):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
        optimizer = cls([{"params": model[0].parameters()}, {"params": model[2].parameters(), "lr": 0.02}],
                        lr=0.01, **options)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
        x = torch.randn(8, 6)
        for step in range(4):
            loss = model(x).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            if step == 1:  # a checkpoint's round trip, as a resumed run does it
                optimizer.load_state_dict(optimizer.state_dict())
        optimizer.step(lambda: model(x).square().mean())  # with a closure
        return [p.detach().clone() for p in model.parameters()], optimizer.state_dict()

    settings = [(torch.optim.Adam, dict(betas=(0.9, 0.99), weight_decay=1e-4)),
                (torch.optim.AdamW, dict(weight_decay=1e-2)), (torch.optim.SGD, dict(momentum=0.9, weight_decay=1e-4))]
    ours = [train(eager(cls), **options) for cls, options in settings]
    assert "torch._dynamo" not in sys.modules, "an eager optimizer imported torch._dynamo"
    builtin = [train(cls, **options) for cls, options in settings]
    assert "torch._dynamo" in sys.modules  # the built-ins do: the comparison is with torch's own path
    for (cls, _), (params, state), (ref_params, ref_state) in zip(settings, ours, builtin):
        assert all(torch.equal(a, b) for a, b in zip(params, ref_params)), cls
        assert state["param_groups"] == ref_state["param_groups"], cls
        for key, values in ref_state["state"].items():
            assert all(torch.equal(values[k], state["state"][key][k]) for k in values), cls
    print("ok")
""")


def test_eager_optimizers_match_torch_optim_bit_for_bit_without_torch_dynamo():
    out = subprocess.run([sys.executable, "-c", CODE], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr
