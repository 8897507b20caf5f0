"""SGM: SGPS's subgroup generation module (Yu et al., TIP 2024, Sec. III-D, Algorithms 1-4).

Works on the feature bank (unit vectors, one per training row) and the noisy labels, and gives every row two
subgroup labels: ``c^B`` (bottom-up, Alg. 2) and ``c^T`` (top-down, Algs. 3-4). Pure numpy / scipy / faiss,
no torch, so it is tested and benchmarked on its own (``scripts/bench_sgps.py``).

Readings of the paper (the spec's A-numbers, ``sgps-spec.md``):

- Alg. 1 (Eq. 4): within a class, each row links to its most similar class-mate (self excluded, A29) and to
  every class-mate with similarity > ``lambda_max``; every edge below ``lambda_min`` is pruned (l.6). Connected
  components of the undirected graph are the subgroups; an outlier is a singleton subgroup and stays in play.
  The largest subgroup of a class is its meta cluster (ties: the lowest subgroup id). Class similarities are
  computed in row blocks: never a class x class matrix of a huge class at once.
- Alg. 2 (Eq. 5): global, cross-class merging of the subgroups with the most similar centroids. Two meta
  clusters never merge (A10: ``meta_merge_similarity`` = the text's lambda'_max; 1.0, the default, reproduces
  Alg. 2, which has no such input); a merged group is meta if either part is (A9); a merge may not exceed
  ``tau_max`` samples (A12, ``<=``); a rejected pair is dropped for good (l.14) while its groups stay; merging
  stops at ``tau_k`` groups (A11, ``<=``) or when the best similarity is below ``min_similarity`` (lambda'_min).
  The best pair comes from a heap over a candidate graph (each centroid's ``neighbours`` nearest, by faiss,
  made symmetric; a merged group's candidates are its parts' candidates, its ``neighbours`` most similar kept):
  exact Alg. 2 when ``neighbours >= M_c - 1`` (a test checks it against a direct transcription), the spec's
  A32 approximation at SOP size. No pair matrix and no Python loop over pairs: the loop is over merges; the
  graph's pairs are NumPy arrays, their cosines computed a block at a time (memory measured at 100K subgroups:
  2.3 GB peak, 15.5 GB when the cosines were one product and each pair a Python tuple).
- Algs. 3-4 (Eq. 6): the intra-class subgroups (A18), normalised centroids, one cell at first; a cell with at
  least ``cell_size`` (B) samples and more than one subgroup is split by the hyperplane bisecting two of its
  subgroups' centroids, two meta clusters when it has several (A17), drawn with a seeded generator (A16); an
  explicit stack, not recursion; the second centroid of the pair always goes right, so a split of identical
  centroids still makes progress and terminates.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field

import numpy as np

from noisydml.neighbours import knn


@dataclass
class Subgroups:
    """Alg. 1's output: ``subgroup`` per row (0..M_c-1), and per subgroup its class, size and meta flag."""

    subgroup: np.ndarray
    subgroup_class: np.ndarray
    size: np.ndarray
    meta: np.ndarray

    @property
    def count(self) -> int:
        return len(self.size)


@dataclass
class SgmResult:
    """One SGM pass: both labellings of every row, and what happened (no ground truth here)."""

    intra: Subgroups
    bottom_up: np.ndarray  # c^B per row, dense ids
    top_down: np.ndarray   # c^T per row, dense ids
    stats: dict[str, float] = field(default_factory=dict)


def _dense(values: np.ndarray) -> np.ndarray:
    return np.unique(values, return_inverse=True)[1].astype(np.int64)


def unit_rows(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(norms > 0, norms, 1.0)


def _class_blocks(features: np.ndarray, labels: np.ndarray, block_rows: int):
    """Per class with two rows or more, in blocks of at most ``block_rows`` rows: ``(members, start, sims)``,
    ``sims`` the similarities of rows ``members[start:start + len(sims)]`` to every class-mate, each row's own
    entry -inf (Eq. 4's ``max_k`` excludes the row itself, A29). Never more than a block x class size matrix."""
    feats = np.ascontiguousarray(features, dtype=np.float32)
    order = np.argsort(labels, kind="stable")
    for members in np.split(order, np.flatnonzero(np.diff(labels[order])) + 1):
        if len(members) < 2:
            continue
        block_feats = feats[members]
        for start in range(0, len(members), block_rows):
            sims = block_feats[start : start + block_rows] @ block_feats.T  # (rows, class size)
            own = np.arange(len(sims))
            sims[own, start + own] = -np.inf
            yield members, start, sims


def intra_class_subgroups(features: np.ndarray, labels: np.ndarray, lambda_max: float, lambda_min: float,
                          block_rows: int = 2048) -> Subgroups:
    """Alg. 1 on every class: Eq. 4's links, pruned below ``lambda_min``, connected components, meta clusters."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    if lambda_min > lambda_max:
        raise ValueError(f"lambda_min {lambda_min} > lambda_max {lambda_max}: Alg. 1 needs lambda_min <= lambda_max")
    labels = np.asarray(labels, dtype=np.int64)
    n = len(labels)
    src, dst = [], []
    for members, start, sims in _class_blocks(features, labels, block_rows):
        rows = members[start : start + len(sims)]
        own = np.arange(len(sims))
        nearest = sims.argmax(axis=1)
        best = sims[own, nearest]
        linked = best >= lambda_min  # Alg. 1 l.6 prunes every edge below lambda_min
        src.append(rows[linked])
        dst.append(members[nearest[linked]])
        r, c = np.nonzero((sims > lambda_max) & (sims >= lambda_min))
        src.append(rows[r])
        dst.append(members[c])
    if src:
        s, d = np.concatenate(src), np.concatenate(dst)
    else:
        s = d = np.zeros(0, np.int64)
    graph = coo_matrix((np.ones(len(s), np.int8), (s, d)), shape=(n, n)).tocsr()
    _, component = connected_components(graph, directed=False)  # ids in order of each component's first row
    component = component.astype(np.int64)
    size = np.bincount(component)
    subgroup_class = np.zeros(len(size), np.int64)
    subgroup_class[component] = labels
    # meta cluster of each class: its largest subgroup, the lowest id on ties
    ids = np.arange(len(size))
    ranked = np.lexsort((ids, -size, subgroup_class))
    first = np.ones(len(ranked), bool)
    first[1:] = subgroup_class[ranked][1:] != subgroup_class[ranked][:-1]
    meta = np.zeros(len(size), bool)
    meta[ranked[first]] = True
    return Subgroups(component, subgroup_class, size, meta)


def intra_class_nearest(features: np.ndarray, labels: np.ndarray, block_rows: int = 2048) -> np.ndarray:
    """Each row's similarity to its most similar class-mate (Eq. 4's ``max_k S_ik``, self excluded; ``nan`` for a
    row alone in its class)."""
    labels = np.asarray(labels, dtype=np.int64)
    out = np.full(len(labels), np.nan, dtype=np.float64)
    for members, start, sims in _class_blocks(features, labels, block_rows):
        out[members[start : start + len(sims)]] = sims.max(axis=1)
    return out


THRESHOLD_KEYS = ("lambda_max", "lambda_min", "merge_min_similarity")


def similarity_thresholds(features: np.ndarray, labels: np.ndarray, cfg: dict) -> dict[str, float]:
    """``lambda_max``, ``lambda_min`` and ``lambda'_min`` as cosine similarities. ``thresholds: absolute``: the
    values as given. ``thresholds: quantile`` (ours; the spec's A15 option, the authors' ``adapt_threshold``): each
    value is a quantile level in [0, 1] of the rows' intra-class nearest-neighbour similarities (by noisy label) in
    this pass's features, so that the thresholds follow the feature space as it trains and across datasets and
    backbones. No ground truth enters: only the labels SGM is given."""
    if cfg["thresholds"] == "absolute":
        return {key: float(cfg[key]) for key in THRESHOLD_KEYS}
    nearest = intra_class_nearest(features, labels)
    nearest = nearest[~np.isnan(nearest)]
    if not len(nearest):
        return {key: 1.0 for key in THRESHOLD_KEYS}  # no class has two rows: nothing links, nothing merges
    return {key: float(np.quantile(nearest, cfg[key])) for key in THRESHOLD_KEYS}


def _centroid_sums(features: np.ndarray, subgroup: np.ndarray, count: int) -> np.ndarray:
    sums = np.zeros((count, features.shape[1]), np.float64)
    np.add.at(sums, subgroup, np.asarray(features, dtype=np.float64))
    return sums


#: Candidate pairs whose centroid cosine is computed at a time (ours): 65,536 x 512 float64 x 2 sides = 0.5 GB,
#: where one product over all pairs took 2 x pairs x d x 8 bytes (14.4 GB at 100K subgroups).
PAIR_BLOCK = 1 << 16


def pair_cosines(unit: np.ndarray, pairs: np.ndarray, block: int = PAIR_BLOCK) -> np.ndarray:
    """``unit[i] . unit[j]`` of every row ``(i, j)`` of ``pairs``, in blocks of ``block`` pairs (float64, the same
    values as one product)."""
    out = np.empty(len(pairs), np.float64)
    for start in range(0, len(pairs), block):
        rows = pairs[start:start + block]
        out[start:start + block] = np.einsum("ij,ij->i", unit[rows[:, 0]], unit[rows[:, 1]])
    return out


class _Candidates:
    """Each group's candidate partners: the k-NN graph's, read from CSR arrays (8 bytes an edge), and a Python set
    only for the groups a merge has changed (a set per group took ~2 KB, 10 GB at 5M subgroups)."""

    def __init__(self, m: int, pairs: np.ndarray):
        both = np.concatenate([pairs, pairs[:, ::-1]])
        order = np.lexsort((both[:, 1], both[:, 0]))
        self.targets = both[order, 1]
        self.starts = np.searchsorted(both[order, 0], np.arange(m + 1))
        self.changed: dict[int, set[int]] = {}

    def of(self, x: int) -> set[int]:
        if x in self.changed:
            return self.changed[x]
        return set(self.targets[self.starts[x]:self.starts[x + 1]].tolist())

    def set(self, x: int, values: set[int]) -> None:
        self.changed[x] = values

    def add(self, x: int, value: int) -> None:
        if x not in self.changed:
            self.changed[x] = self.of(x)
        self.changed[x].add(value)


def bottom_up(features: np.ndarray, groups: Subgroups, tau_k: int, tau_max: int, min_similarity: float,
              meta_merge_similarity: float = 1.0, neighbours: int = 32,
              use_gpu: bool = False) -> tuple[np.ndarray, dict[str, float]]:
    """Alg. 2 (Eq. 5): ``c^B`` per row and counts (merges, rejections by the meta and the size rule).

    The best pair is the smallest ``(-similarity, i, j, generation_i, generation_j)`` among the k-NN graph's pairs
    (sorted once, as NumPy arrays) and the pairs merges create (a heap): the order one heap of all of them gives,
    without a Python tuple per pair (150 bytes each; hundreds of millions at MS1MV0's size). The candidate graph's
    exact k-NN search is the part that grows as the square of the subgroups (``use_gpu``: on the process's GPU,
    :func:`noisydml.neighbours.knn`)."""
    m = groups.count
    sums = _centroid_sums(features, groups.subgroup, m)
    unit = unit_rows(sums)  # Eq. 5's cosine of centroids (means): the scale cancels, sums will do
    size = groups.size.astype(np.int64).copy()
    meta = groups.meta.copy()
    parent = np.arange(m)
    alive = np.ones(m, bool)
    generation = np.zeros(m, np.int64)
    stats = {"merges": 0, "rejected_meta": 0, "rejected_size": 0}
    if m <= 1 or m <= tau_k:
        return _dense(groups.subgroup), stats

    def find(x: int) -> int:
        root = x
        while parent[root] != root:
            root = parent[root]
        while parent[x] != root:
            parent[x], x = root, parent[x]
        return root

    k = min(neighbours, m - 1)
    t0 = time.perf_counter()
    _, idx = knn(unit.astype(np.float32), k, use_gpu=use_gpu)
    stats["seconds_knn"] = time.perf_counter() - t0
    rows = np.repeat(np.arange(m), k)
    cols = idx.reshape(-1)
    valid = cols >= 0
    pairs = np.unique(np.sort(np.stack([rows[valid], cols[valid]], 1), axis=1), axis=0)
    pairs = pairs[pairs[:, 0] != pairs[:, 1]]
    del rows, cols, valid, idx
    candidates = _Candidates(m, pairs)
    # the k-NN pairs in the heap's order: -similarity, then i, then j (their generations are all 0)
    neg = -pair_cosines(unit, pairs)
    order = np.lexsort((pairs[:, 1], pairs[:, 0], neg))
    static_neg, static_i, static_j = neg[order], pairs[order, 0], pairs[order, 1]
    del pairs, neg, order
    at, total = 0, len(static_neg)
    heap: list[tuple[float, int, int, int, int]] = []  # pairs that merges created
    active = m
    while (at < total or heap) and active > tau_k:
        if at < total:
            static = (float(static_neg[at]), int(static_i[at]), int(static_j[at]), 0, 0)
            if not heap or static < heap[0]:
                at += 1
                neg_s, i, j, gi, gj = static
            else:
                neg_s, i, j, gi, gj = heapq.heappop(heap)
        else:
            neg_s, i, j, gi, gj = heapq.heappop(heap)
        if not (alive[i] and alive[j]) or generation[i] != gi or generation[j] != gj:
            continue  # a pair of groups that have changed since: its current version is in the heap
        s = -neg_s
        if s < min_similarity:
            break  # the best remaining pair is below lambda'_min
        if meta[i] and meta[j] and not s > meta_merge_similarity:
            stats["rejected_meta"] += 1
            continue  # Alg. 2 l.14: this pair is ignored from now on
        if size[i] + size[j] > tau_max:
            stats["rejected_size"] += 1
            continue
        a, b = (i, j) if i < j else (j, i)
        sums[a] += sums[b]
        size[a] += size[b]
        meta[a] = meta[a] or meta[b]
        alive[b] = False
        parent[b] = a
        generation[a] += 1
        unit[a] = unit_rows(sums[a][None])[0]
        near = {find(x) for x in candidates.of(a) | candidates.of(b)} - {a}
        near = np.fromiter((x for x in near if alive[x]), np.int64)
        candidates.set(b, set())
        if len(near):
            near_sims = unit[near] @ unit[a]
            if len(near) > neighbours:
                top = np.argsort(-near_sims, kind="stable")[:neighbours]
                near, near_sims = near[top], near_sims[top]
            candidates.set(a, set(near.tolist()))
            for x, sx in zip(near.tolist(), near_sims.tolist()):
                candidates.add(x, a)
                lo, hi = (a, x) if a < x else (x, a)
                heapq.heappush(heap, (-sx, lo, hi, int(generation[lo]), int(generation[hi])))
        else:
            candidates.set(a, set())
        stats["merges"] += 1
        active -= 1
    roots = np.fromiter((find(x) for x in range(m)), np.int64, count=m)
    return _dense(roots[groups.subgroup]), stats


def top_down(features: np.ndarray, groups: Subgroups, cell_size: int, rng: np.random.Generator) -> np.ndarray:
    """Algs. 3-4 (Eq. 6): ``c^T`` per row, the cells of the recursive bisection of the intra-class subgroups."""
    m = groups.count
    unit = unit_rows(_centroid_sums(features, groups.subgroup, m))  # Alg. 4 l.2: normalised centroids
    cell_of = np.zeros(m, np.int64)
    stack = [np.arange(m)]
    cells = 0
    while stack:
        cell = stack.pop()
        if groups.size[cell].sum() >= cell_size and len(cell) > 1:  # Alg. 3 l.2
            metas = cell[groups.meta[cell]]
            pool = metas if len(metas) > 1 else cell  # l.3-6: two meta clusters when there are several
            i, j = rng.choice(pool, size=2, replace=False)
            h = (unit[i] - unit[j]) / 2.0  # Eq. 6
            left = unit[cell] @ h >= 0
            left[cell == i] = True   # i is on its own side (exact arithmetic says so; rounding may not)
            left[cell == j] = False  # A16: j goes right, so identical centroids still split
            stack.append(cell[~left])
            stack.append(cell[left])
        else:
            cell_of[cell] = cells
            cells += 1
    return cell_of[groups.subgroup]


def run_sgm(features: np.ndarray, labels: np.ndarray, cfg: dict, rng: np.random.Generator,
            top_down_labels: bool = True, use_gpu: bool = False) -> SgmResult:
    """One SGM pass (Algs. 1, 2 and 3-4) with the settings of ``methods.<sgps>.sgm`` (see :func:`sgm_sizes`);
    ``use_gpu``: Alg. 2's candidate search on the GPU (a run whose bank is on CUDA)."""
    t0 = time.perf_counter()
    features = np.ascontiguousarray(features, dtype=np.float32)
    labels = np.asarray(labels, dtype=np.int64)
    at = similarity_thresholds(features, labels, cfg)
    intra = intra_class_subgroups(features, labels, at["lambda_max"], at["lambda_min"])
    t1 = time.perf_counter()
    tau_k, tau_max, cell_size = sgm_sizes(cfg, len(labels), len(np.unique(labels)))
    cb, merge_stats = bottom_up(features, intra, tau_k, tau_max, at["merge_min_similarity"],
                                cfg["meta_merge_similarity"], cfg["neighbours"], use_gpu)
    t2 = time.perf_counter()
    ct = top_down(features, intra, cell_size, rng) if top_down_labels else np.zeros(len(labels), np.int64)
    t3 = time.perf_counter()
    stats = {"subgroups": intra.count, "meta": int(intra.meta.sum()), "bottom_up_groups": int(cb.max()) + 1,
             "top_down_cells": int(ct.max()) + 1 if top_down_labels else 0, **merge_stats,
             **{f"threshold_{key}": value for key, value in at.items()},
             "seconds_intra": t1 - t0, "seconds_bottom_up": t2 - t1, "seconds_top_down": t3 - t2}
    return SgmResult(intra, cb, ct, stats)


def sgm_sizes(cfg: dict, n: int, classes: int) -> tuple[int, int, int]:
    """``tau_k``, ``tau_max`` and ``B`` in samples/groups from their factors (A13, A14): ``tau_k`` = factor x
    classes, ``tau_max`` and ``B`` = factor x the mean class size N / M (at least 2)."""
    mean_class = n / max(classes, 1)
    tau_k = max(1, int(round(cfg["tau_k_factor"] * classes)))
    tau_max = max(2, int(round(cfg["tau_max_factor"] * mean_class)))
    cell_size = max(2, int(round(cfg["cell_size_factor"] * mean_class)))
    return tau_k, tau_max, cell_size
