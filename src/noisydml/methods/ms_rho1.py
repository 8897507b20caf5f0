"""``ms_rho1``: the multi-similarity baseline at BSPML's rho = 1 (pml's ``base``; ``ms`` keeps pml's 0.5).

BSPML's paper runs "MS loss and the MS loss part of our BSPML" with rho = 1: the fair baseline for ``bspml``.
"""

from dataclasses import replace

from noisydml.methods.parts.pml import MS, baseline_spec

SPEC = baseline_spec(replace(MS, loss_defaults={"alpha": 2.0, "beta": 50.0, "base": 1.0},
                             description="multi-similarity loss + miner at rho (base) = 1, BSPML's setting"))
