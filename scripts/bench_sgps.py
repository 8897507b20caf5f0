"""SGPS's costs on this machine; prints figures (never a timed test).

    python scripts/bench_sgps.py [--samples 59551 --classes 11318 --dim 128 --noise 0.5 --steps 60 --threads 2]

1. One full SGM pass (Alg. 1, Alg. 2, Algs. 3-4) on an SOP-sized feature bank: 59,551 unit vectors of 128-d
   around 11,318 class centres, half the labels flipped at random (so the noisy rows are outliers of their
   labelled class and Alg. 2 has real cross-class merging to do), with params.yaml's sgps.sgm settings.
2. SGPS's per-step overhead over PRISM with the default backbone and batch (params.yaml's train section), on
   glyph-sized images: the same batches through forward, loss, backward and the optimizer step, PRISM, SGPS with
   the bank's positives and SGPS with forwarded positives (``positive_source: forward``: K extra images per item
   in the same pass, as the trainer does), alternated over ``--repeats`` rounds (the median is reported). SGPS's
   SGM labels are made once beforehand, as between two of its epoch-boundary passes; the SGM pass itself is
   amortised over an epoch (printed apart).
"""

from __future__ import annotations

import argparse
import copy
import time

import numpy as np
import torch

from noisydml.config import load_params
from noisydml.methods import build_method, check_method
from noisydml.methods.base import Batch, MethodSetup
from noisydml.methods.parts.sgm import run_sgm
from noisydml.models import build_model


def _bank(samples: int, classes: int, dim: int, noise: float, seed: int = 0):
    rng = np.random.default_rng(seed)
    true = np.concatenate([np.repeat(np.arange(classes), 2), rng.integers(0, classes, samples - 2 * classes)])
    centres = rng.standard_normal((classes, dim)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    feats = centres[true] + 0.04 * rng.standard_normal((samples, dim)).astype(np.float32)
    feats /= np.linalg.norm(feats, axis=1, keepdims=True)
    labels = true.copy()
    flip = rng.random(samples) < noise
    labels[flip] = rng.integers(0, classes, int(flip.sum()))
    return feats, labels, true


def bench_sgm(args, sgm_cfg: dict) -> None:
    feats, labels, true = _bank(args.samples, args.classes, args.dim, args.noise)
    print(f"SGM on {args.samples:,} x {args.dim} unit features, {args.classes:,} classes, "
          f"{(labels != true).mean():.0%} labels flipped; sgm settings {sgm_cfg}")
    t = time.perf_counter()
    r = run_sgm(feats, labels, sgm_cfg, np.random.default_rng(0))
    total = time.perf_counter() - t
    s = r.stats
    print(f"  Alg. 1 (intra-class):  {s['seconds_intra']:6.2f} s  {s['subgroups']:,} subgroups, {s['meta']:,} meta")
    print(f"  Alg. 2 (bottom-up):    {s['seconds_bottom_up']:6.2f} s  {s['merges']:,} merges -> "
          f"{s['bottom_up_groups']:,} groups (rejected: {s['rejected_meta']:,} meta, {s['rejected_size']:,} size)")
    print(f"  Algs. 3-4 (top-down):  {s['seconds_top_down']:6.2f} s  {s['top_down_cells']:,} cells")
    print(f"  one full SGM pass:     {total:6.2f} s")


def bench_steps(args, params: dict) -> None:
    train = params["train"]
    rng = np.random.default_rng(0)
    n, classes = 6400, 200
    images = torch.from_numpy(rng.uniform(-1, 1, (n, 1, 32, 32)).astype(np.float32))
    labels = np.repeat(np.arange(classes), n // classes)
    batch_size = train["batch"]["classes"] * train["batch"]["per_class"]
    batches = [rng.choice(n, batch_size, replace=False) for _ in range(args.steps)]
    variants = {"prism": ("prism", "bank"), "sgps": ("sgps", "bank"), "sgps_forward": ("sgps", "forward")}
    timings = {name: [] for name in variants}
    setups = {}
    for name, (method_name, source) in variants.items():
        params_ = copy.deepcopy(params)
        if method_name == "sgps":
            params_["methods"]["sgps"]["positive_source"] = source
        hp = check_method(params_, method_name)
        torch.manual_seed(0)
        model = build_model(train, in_channels=1)
        method = build_method(method_name, MethodSetup(hp, classes, train["embedding_dim"], n, labels, seed=0))
        if method_name == "sgps":
            with torch.no_grad():
                model.eval()
                bank = torch.cat([model(images[i:i + 512]) for i in range(0, n, 512)])
                model.train()
            method.bank.copy_(bank)
            r = run_sgm(bank.numpy(), labels, hp["sgm"], np.random.default_rng(0))
            method.bottom_up_labels.copy_(torch.from_numpy(r.bottom_up))
            method.top_down_labels.copy_(torch.from_numpy(r.top_down))
            method.sgm_round.fill_(1)
            method._set_pools()
            print(f"SGM pass on the {n:,}-row glyph bank: "
                  f"{sum(v for k, v in r.stats.items() if k.startswith('seconds')):.2f} s (once per epoch of "
                  f"{n // batch_size} steps)")
        params_ = list(model.parameters()) + list(method.parameters())
        optimizer = torch.optim.Adam(params_, lr=train["optimizer"]["lr"])
        setups[name] = (model, method, optimizer)
    labels_t = torch.from_numpy(labels)

    def run(name: str, step0: int) -> float:
        model, method, optimizer = setups[name]
        t = time.perf_counter()
        for k, idx in enumerate(batches):
            index = torch.from_numpy(idx)
            request = method.extra_samples(idx, 0, step0 + k)  # an ExtraRows request (or None)
            extra_rows = None if request is None else request.rows
            rows = idx if extra_rows is None else np.concatenate([idx, extra_rows])
            emb, feats = model.forward_with_features(images[torch.from_numpy(rows)])
            extra = None
            if extra_rows is not None:  # one training-mode pass over batch + positives, as the trainer does
                extra_index = torch.from_numpy(extra_rows)
                extra = Batch(emb[len(idx):], feats[len(idx):], labels_t[extra_index], extra_index, extra_index,
                              step=step0 + k, epoch=0, request=request)
                emb, feats = emb[:len(idx)], feats[:len(idx)]
            batch = Batch(emb, feats, labels_t[index], index, index, step=step0 + k, epoch=0, extra=extra)
            loss, _ = method.loss(batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        return (time.perf_counter() - t) / len(batches)

    for name in variants:
        run(name, 0)  # warm-up: memories fill, PCS starts rejecting
    for r in range(args.repeats):
        for name in variants:
            timings[name].append(run(name, (r + 1) * args.steps))
    median = {name: np.median(t) for name, t in timings.items()}
    k = params["methods"]["sgps"]["positives_per_sample"]
    print(f"per step, batch {batch_size}, backbone {train['backbone']} width {train['backbone_width']}, "
          f"{train['embedding_dim']}-d, torch threads {torch.get_num_threads()} (median of {args.repeats} x "
          f"{args.steps} steps): PRISM {1000 * median['prism']:.1f} ms, SGPS (bank positives) "
          f"{1000 * median['sgps']:.1f} ms (x{median['sgps'] / median['prism']:.3f}), SGPS (forwarded positives, "
          f"{batch_size} + {k} x {batch_size} images) {1000 * median['sgps_forward']:.1f} ms "
          f"(x{median['sgps_forward'] / median['prism']:.3f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=59551)
    parser.add_argument("--classes", type=int, default=11318)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--noise", type=float, default=0.5)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--skip-sgm", action="store_true")
    parser.add_argument("--skip-steps", action="store_true")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    params = load_params("params.yaml")
    sgm_cfg = check_method(copy.deepcopy(params), "sgps")["sgm"]
    if not args.skip_sgm:
        bench_sgm(args, sgm_cfg)
    if not args.skip_steps:
        bench_steps(args, params)


if __name__ == "__main__":
    main()
