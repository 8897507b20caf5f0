"""The method_code stage: each method's code -> ``code/methods/<method>.json``.

A method's code is its module and the package files it imports (:func:`noisydml.closure.closure`: the parts of
``methods/parts`` it builds on, and what those import), each with its sha256. Every stage that trains a method
depends on that method's file here instead of on ``methods/``: after an edit this stage runs first (it trains
nothing: a second), and only the methods whose file changed are re-trained, since DVC runs a stage again only when
one of its dependencies changed. DVC's templates cannot list a different set of files per matrix item, which is why
the set is a file of its own.
"""

from __future__ import annotations

from pathlib import Path

from noisydml import io
from noisydml.closure import file_digests, module_closure
from noisydml.methods import method_names

#: The stage's output folder, relative to the repository root.
METHOD_CODE = Path("code/methods")


def method_code(name: str) -> dict:
    """``{"method", "files": {path: sha256}}``: the files method ``name``'s module runs (paths under src/)."""
    return {"method": name, "files": file_digests(module_closure(f"noisydml.methods.{name}"))}


def write_method_code(folder: Path = METHOD_CODE) -> list[str]:
    """One file per method of the catalog; returns the methods written."""
    names = method_names()
    with io.atomic_dir(folder) as tmp:
        for name in names:
            io.write_json(tmp / f"{name}.json", method_code(name))
    return names
