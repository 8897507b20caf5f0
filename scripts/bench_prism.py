"""Benchmark: per-step cost of PRISM's selection, against plain MCL and the default backbone's training step.

Setting of the issue and of PRISM's speed comparison: batch 64, embedding 512,
memory 8,192 (filled), 98 classes (CARS). Prints the mean time per step of

- MCL (XBM contrastive loss over batch + memory, forward and backward);
- PRISM's selection with centres (Eq. 7: P_clean from class centres, TRM/sTRM
  threshold, enqueue with centre updates) and without centres (Eq. 3: every
  memory feature);
- one training step of the default backbone (params.yaml's train section:
  forward, backward, optimizer step on a batch of glyph-sized images),

and the selection overhead relative to each.

    python scripts/bench_prism.py
    python scripts/bench_prism.py --steps 50 --embedding 128 --classes 11318   # SOP-like
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.nn.functional as F

from noisydml.config import load_params
from noisydml.methods import build_method, load_spec
from noisydml.methods.base import Batch, MethodSetup
from noisydml.methods.parts.prism import ClassCentreMemory, SlidingThreshold, clean_probability
from noisydml.models import build_model


def as_batch(embeddings: torch.Tensor, labels: torch.Tensor, step: int = 0) -> Batch:
    """A batch as the trainer hands it to a method (rows 0..B-1 of the table)."""
    rows = torch.arange(len(labels))
    return Batch(embeddings=embeddings, features=embeddings, labels=labels, index=rows, sample_id=rows, step=step,
                 epoch=0)


def per_step(fn, steps: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    return (time.perf_counter() - t0) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--embedding", type=int, default=512)
    parser.add_argument("--memory", type=int, default=8192)
    parser.add_argument("--classes", type=int, default=98)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--params", default="params.yaml")
    args = parser.parse_args()
    torch.manual_seed(0)
    b, d, m, c = args.batch, args.embedding, args.memory, args.classes
    print(f"torch threads {torch.get_num_threads()}; batch {b}, embedding {d}, memory {m}, classes {c}\n")

    # batches drawn beforehand, so that drawing random numbers is not timed
    pool = [(F.normalize(torch.randn(b, d), dim=1), torch.randint(0, c, (b,))) for _ in range(32)]
    counter = iter(range(10**9))

    def batch():
        emb, lab = pool[next(counter) % len(pool)]
        return emb.clone().requires_grad_(), lab

    # plain MCL: XBM contrastive loss, forward + backward, memory filled first
    hp = load_spec("mcl").check({"memory_size": m}, "methods.mcl")
    setup = MethodSetup(hp, c, d, 10 * m, np.zeros(1, int), 0)
    mcl = build_method("mcl", setup)
    for _ in range(m // b + 1):
        emb, lab = batch()
        mcl.loss(as_batch(emb, lab))

    def mcl_step():
        emb, lab = batch()
        loss, _ = mcl.loss(as_batch(emb, lab))
        loss.backward()

    t_mcl = per_step(mcl_step, args.steps)

    # PRISM's selection alone (what it adds in front of MCL)
    memory = ClassCentreMemory(m, d, c)
    for _ in range(m // b + 1):
        emb, lab = batch()
        memory.enqueue(emb, lab)
    threshold = SlidingThreshold(0.5, 30)

    def selection(centres: bool):
        def step():
            emb, lab = batch()
            keep, _ = threshold.select(clean_probability(memory, emb, lab, centres=centres))
            memory.enqueue(emb[keep], lab[keep])
        return step

    t_centres = per_step(selection(True), args.steps)
    t_plain = per_step(selection(False), args.steps)

    # one training step of the default backbone
    params = load_params(args.params)
    train = params["train"]
    ds = next(iter(params["datasets"].values()))
    side = ds.get("image_size", 32)
    model = build_model(train, in_channels=1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    images = torch.rand(b, 1, side, side)

    def backbone_step():
        emb = model(images)
        loss = emb.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()

    t_backbone = per_step(backbone_step, max(20, args.steps // 5))

    rows = [
        ("MCL loss (forward + backward)", t_mcl),
        ("PRISM selection, with centres (Eq. 7)", t_centres),
        ("PRISM selection, without centres (Eq. 3)", t_plain),
        (f"default backbone step ({train['backbone']} width {train['backbone_width']}, "
         f"{side}x{side}, embedding {train['embedding_dim']})", t_backbone),
    ]
    for name, t in rows:
        print(f"{name:<75}{1e3 * t:9.3f} ms")
    print()
    print(f"PRISM with centres adds    {100 * t_centres / t_mcl:6.1f}% to an MCL loss step, "
          f"{100 * t_centres / t_backbone:6.1f}% to a default backbone step")
    print(f"PRISM without centres adds {100 * t_plain / t_mcl:6.1f}% to an MCL loss step, "
          f"{100 * t_plain / t_backbone:6.1f}% to a default backbone step")
    print(f"centres make the selection {t_plain / t_centres:.1f}x faster")


if __name__ == "__main__":
    main()
