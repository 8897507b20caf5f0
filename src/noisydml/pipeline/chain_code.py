"""The chain_code stage: what a tuned chained run is trained after -> ``code/chains/<dataset>-<noise>-<name>.json``.

A tuned chain (``tuning.chains``) is named, not keyed: DVC's templates cannot look its entry of ``chains`` up, nor
its method, so its stages (``tune_chain``, ``train_tuned_chain``) would have to depend on every method's code and
on the whole ``methods`` and ``chains`` sections. This stage reads them and writes the chain's lineage alone (:func:
`noisydml.runs.lineage`): the chains it is trained after and its own entry, the hyper-parameters and the code files
(``code/methods/<method>.json``, their sha256) of the methods they train, and its method's search space. The tuned
chain's stages depend on that file: DVC re-runs them when their lineage changed, not when another method did.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from noisydml import io
from noisydml.pipeline.code_digests import METHOD_CODE
from noisydml.runs import lineage

#: The stage's output folder, relative to the repository root.
CHAIN_CODE = Path("code/chains")


def chain_code(params: dict, dataset: str, noise: str, name: str, root: Path = Path(".")) -> dict:
    """The lineage of the chained run ``name`` at ``dataset``/``noise``, as its tuned stages train it."""
    upstream, steps = lineage(params["chains"], dataset, noise, name)
    methods = [upstream, *(chain["method"] for _, chain in steps)]
    method = steps[-1][1]["method"]
    return {"chain": name, "dataset": dataset, "noise": noise, "root": upstream,
            "steps": [{"key": key, **chain} for key, chain in steps],
            "methods": {m: params["methods"][m] for m in methods},
            "space": {method: params["tuning"]["spaces"][method]},
            "code": {m: hashlib.sha256((root / METHOD_CODE / f"{m}.json").read_bytes()).hexdigest() for m in methods}}


def write_chain_code(params: dict, dataset: str, noise: str, name: str, folder: Path = CHAIN_CODE) -> Path:
    path = folder / f"{dataset}-{noise}-{name}.json"
    io.write_json(path, chain_code(params, dataset, noise, name))
    return path
