"""The package files a piece of code runs: its import closure, read from the source (no import is executed).

The DVC stages' code dependencies (``scripts/stage_deps.py`` writes them into dvc.yaml), each method's code
(``stages/method_code.py`` -> ``code/methods/<method>.json``, what a train stage depends on) and the fingerprint
that decides whether a killed run may resume (:func:`digest`) all come from here, so all three name the same
files. The closure follows every ``import noisydml...`` / ``from noisydml... import ...`` statement, at module level
or inside functions, and the package ``__init__`` files Python runs on the way. A module imported by name at run
time (a method, a study, a params section's owner) is added by whoever imports it so.
"""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path

#: The folder holding the ``noisydml`` package (``src/``).
SRC = Path(__file__).resolve().parents[1]


def module_file(name: str) -> Path | None:
    """The file of module ``name`` under :data:`SRC` (a package's ``__init__.py``), or None."""
    base = SRC.joinpath(*name.split("."))
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    return None


def imported_modules(path: Path) -> set[str]:
    """The ``noisydml`` modules ``path`` imports (anywhere in it), with the packages Python runs on the way."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(Path(path).read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.split(".")[0] == "noisydml")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                node.module.split(".")[0] == "noisydml":
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names if module_file(f"{node.module}.{a.name}"))
    # importing a.b.c runs a/__init__ and a/b/__init__ first
    with_parents = set()
    for name in names:
        parts = name.split(".")
        with_parents.update(".".join(parts[: i + 1]) for i in range(len(parts)))
    return with_parents


def closure(*paths: Path) -> set[Path]:
    """Every noisydml source file that importing/running ``paths`` executes (``paths`` included), resolved."""
    seen: set[Path] = set()
    todo = [Path(p).resolve() for p in paths]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in imported_modules(path):
            file = module_file(name)
            if file is not None and file.resolve() not in seen:
                todo.append(file.resolve())
    return seen


def module_closure(*modules: str) -> set[Path]:
    """:func:`closure` of modules named ``noisydml.<...>``."""
    files = [module_file(name) for name in modules]
    missing = [name for name, file in zip(modules, files) if file is None]
    if missing:
        raise ValueError(f"no module {missing[0]!r} under {SRC}")
    return closure(*files)


def file_digests(paths, root: Path = SRC) -> dict[str, str]:
    """``{path relative to root: sha256 of its bytes}``, sorted by path."""
    rel = {str(Path(p).resolve().relative_to(root)): Path(p) for p in paths}
    return {name: hashlib.sha256(rel[name].read_bytes()).hexdigest() for name in sorted(rel)}


def digest(paths) -> str:
    """One sha256 over files' paths (relative to :data:`SRC`) and bytes: a resumed run needs the same code."""
    total = hashlib.sha256()
    for name, sha in file_digests(paths).items():
        total.update(f"{name}\0{sha}\0".encode())
    return total.hexdigest()
