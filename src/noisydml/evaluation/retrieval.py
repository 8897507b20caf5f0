"""Retrieval metrics, computed by pytorch-metric-learning's AccuracyCalculator on faiss.

Protocol (as PRISM's and SGPS's code): the test split is both query and
gallery, each query excluded from its own neighbours; embeddings are
L2-normalised, search is exact. In-Shop's protocol instead searches its
queries against a separate gallery (``query_mask``); then R is the number of
gallery items of the query's class. Metrics:

- Precision@1, MAP@R and R-Precision (R = the query's class size - 1), from
  AccuracyCalculator with k = min(max_k, largest class size - 1);
- Recall@K (BSPML's tables): the fraction of queries with a same-class item
  among their K nearest neighbours, added to the calculator below;
- NMI of faiss k-means with as many clusters as test classes.

Memory: the search is faiss's exact flat index, which works through the queries in blocks, so no
(queries x gallery) matrix is ever allocated; the largest arrays are the (queries x k) neighbours (SOP: 60,502
x 1,023 ids and distances, about 0.7 GB), never 60,502^2.

``device`` (``evaluate.device``, ours): ``cpu`` = faiss's exact search on the CPU; ``cuda`` = the exact blocked
torch search on the GPU (:class:`TorchKNN`: no faiss GPU build needed; the same neighbours as faiss, ties
included, up to the last float bits of the distances); ``auto`` = ``cuda`` when a CUDA device is present, else
``cpu`` (said once). NMI's k-means runs on faiss's GPU build when the search is on CUDA and it is installed, else
on the CPU.
"""

from __future__ import annotations

import numpy as np
import torch
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator
from pytorch_metric_learning.utils.inference import FaissKMeans, FaissKNN, return_results

from noisydml.evaluation import metric_names
from noisydml.neighbours import TOPK_BLOCK_BYTES, exact_topk, faiss_gpu_available

_SAID: set[str] = set()


def _say_once(key: str, message: str) -> None:
    if key not in _SAID:
        _SAID.add(key)
        print(message)


def search_device(name: str) -> torch.device:
    """``evaluate.device``: ``cpu``; ``cuda`` = the current CUDA device (an error without one); ``auto`` = the
    current CUDA device when present, else the CPU (said once)."""
    if name == "cpu":
        return torch.device("cpu")
    if name not in ("auto", "cuda"):
        raise ValueError(f"evaluate.device: {name!r}; allowed: cpu, auto, cuda")
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    if name == "cuda":
        raise RuntimeError("evaluate.device: 'cuda', but torch sees no CUDA device here; allowed here: cpu, auto")
    _say_once("auto", "evaluate.device auto: no CUDA device; searching on the CPU (faiss)")
    return torch.device("cpu")


class TorchKNN:
    """A ``knn_func`` for AccuracyCalculator: exact squared-L2 search in torch on the embeddings' device
    (:func:`noisydml.neighbours.exact_topk`, a block of queries at a time), what pytorch-metric-learning's
    ``FaissKNN`` (faiss ``IndexFlatL2``) returns, ties included. Its ``CustomKNN`` would do the product too, but
    leaves ties at the k-th distance to ``torch.topk``, whose choice differs between devices."""

    def __init__(self, block_bytes: int = TOPK_BLOCK_BYTES):
        self.block_bytes = block_bytes

    def __call__(self, query, k, reference=None, ref_includes_query=False):
        if ref_includes_query:
            k = k + 1  # the query finds itself: dropped below, as FaissKNN does
        reference = query if reference is None else reference
        distances, indices = exact_topk(query, reference, k, "l2", block_bytes=self.block_bytes)
        return return_results(distances, indices, ref_includes_query)


def same_label(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Label equality, given to AccuracyCalculator as its ``label_comparison_fn``.

    With its default (``EQUALITY``) pytorch-metric-learning 2.9 counts each class's gallery items by comparing
    every distinct query label with every gallery label at once: a (classes x samples) boolean matrix, 685 MB
    on SOP's test split and growing with the square of the test set (measured: +1.2 GB at 60,000 samples of
    30). With any other function it counts one label at a time, in memory linear in the test set (+226 MB),
    with the same results bit for bit. (Clustering metrics refuse a custom comparison: NMI is computed apart.)"""
    return a == b


class RetrievalCalculator(AccuracyCalculator):
    """AccuracyCalculator plus ``recall_at_<K>`` metrics (K from params)."""

    def __init__(self, recall_at=(), **kwargs):
        self.recall_at = tuple(int(k) for k in recall_at)
        for k in self.recall_at:
            # AccuracyCalculator discovers metrics by their "calculate_" attribute names.
            setattr(self, f"calculate_recall_at_{k}", self._recall_fn(k))
        super().__init__(**kwargs)

    def _recall_fn(self, k: int):
        def calculate(knn_labels, query_labels, not_lone_query_mask, **_):
            knn = knn_labels[not_lone_query_mask][:, :k]
            queries = query_labels[not_lone_query_mask][:, None]
            if len(queries) == 0:
                return float("nan")
            return (knn == queries).any(dim=1).float().mean().item()

        return calculate

    def requires_knn(self):
        return super().requires_knn() + [f"recall_at_{k}" for k in self.recall_at]


def neighbours_used(labels, recall_at=(), max_k: int = 1023, query_mask=None) -> tuple[int, bool]:
    """``(k, exact)``: neighbours retrieved per query, and whether MAP@R / R-Precision are exact.

    MAP@R and R-Precision need R = (the query's class size - 1) neighbours (query/gallery: the class's gallery
    size); with ``max_k`` below that pytorch-metric-learning divides by the full R while only k neighbours
    exist, so they are underestimates for the large classes. The metrics JSON and the report flag that
    (``map_at_r_exact``).
    """
    labels = np.asarray(labels, dtype=np.int64)
    if query_mask is None:
        needed = int(np.bincount(labels).max()) - 1
    else:
        needed = int(np.bincount(labels[~np.asarray(query_mask, bool)]).max())
    k = max(1, min(max_k, max(needed, max(recall_at, default=1))))
    return k, k >= needed


def retrieval_metrics(
    embeddings, labels, recall_at=(1, 2, 4, 8), max_k: int = 1023, nmi: bool = True, seed: int = 0,
    include: tuple[str, ...] | None = None, query_mask=None, device: str = "cpu", knn: str | None = None,
) -> dict[str, float]:
    """All retrieval metrics of a test set: query = gallery, self excluded; or, with ``query_mask`` (True for a
    query row, False for a gallery row), the queries searched against the gallery (NMI: of the queries).

    ``include`` restricts to some metric names (e.g. the cheap ones for per-epoch monitoring). ``device``: where
    the neighbours are searched (:func:`search_device`: faiss on the CPU, :class:`TorchKNN` on CUDA). ``knn``
    (``"faiss"`` or ``"torch"``) overrides the search the device implies (benchmarks and tests: the torch search
    on the CPU).
    """
    emb = torch.as_tensor(np.asarray(embeddings), dtype=torch.float32)
    emb = torch.nn.functional.normalize(emb, dim=1)  # faiss IndexFlatL2 on unit vectors = cosine ranking
    lab = torch.as_tensor(np.array(labels), dtype=torch.int64)  # a copy: labels may be a read-only view
    if len(emb) != len(lab):
        raise ValueError(f"{len(emb)} embeddings but {len(lab)} labels")
    if query_mask is None:
        needed = int(torch.bincount(lab).max()) - 1
    else:
        query = torch.as_tensor(np.array(query_mask, dtype=bool))  # a copy: the mask may be read-only
        if len(query) != len(lab) or not query.any() or query.all():
            raise ValueError(f"query_mask: {int(query.sum())} queries of {len(query)} rows for {len(lab)} labels; "
                             "a query/gallery evaluation needs both")
        needed = int(torch.bincount(lab[~query]).max())
    k, _ = neighbours_used(lab.numpy(), recall_at, max_k, query_mask)
    # With the query in the gallery, "max_bin_count" means largest class - 1 neighbours; naming it
    # that way keeps the library from warning that an equal integer k is too small.
    k_arg = "max_bin_count" if k == needed else k
    names = metric_names(recall_at)
    if not nmi:
        names.remove("nmi")
    if include is not None:
        names = [n for n in names if n in include]
    internal = ["NMI" if n == "nmi" else n for n in names]
    # the kNN metrics with same_label (memory linear in the test set); NMI with the library's default comparison,
    # which it requires for clustering (and which counts no label matches there)
    where = search_device(device)
    knn = knn or ("faiss" if where.type == "cpu" else "torch")
    if knn not in ("faiss", "torch"):
        raise ValueError(f"retrieval_metrics: knn {knn!r}; allowed: faiss, torch")
    knn_func = FaissKNN() if knn == "faiss" else TorchKNN()
    nmi_on_cuda = where.type == "cuda" and "NMI" in internal
    kmeans_gpu = nmi_on_cuda and faiss_gpu_available()
    if nmi_on_cuda and not kmeans_gpu:
        _say_once("kmeans", "evaluate: NMI's k-means on the CPU (faiss has no GPU build here: pip install '.[gpu]')")
    if where.type != "cpu":
        emb, lab = emb.to(where), lab.to(where)
    result: dict = {}
    for group, compare in (([n for n in internal if n != "NMI"], {"label_comparison_fn": same_label}),
                           ([n for n in internal if n == "NMI"], {})):
        if not group:
            continue
        calc = RetrievalCalculator(
            recall_at=recall_at,
            include=tuple(group),
            k=k_arg,
            device=where,
            knn_func=knn_func,
            kmeans_func=FaissKMeans(niter=20, seed=seed, **({"gpu": 1} if kmeans_gpu else {})),
            **compare,
        )
        if query_mask is None:
            result.update(calc.get_accuracy(emb, lab))
        else:
            query = query.to(emb.device)
            result.update(calc.get_accuracy(emb[query], lab[query], emb[~query], lab[~query],
                                            ref_includes_query=False))
    # in the library's order (its metric functions sorted by name), as one calculator returns them
    return {("nmi" if key == "NMI" else key): float(result[key]) for key in sorted(result)}
