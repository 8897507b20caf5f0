"""The package files a piece of code runs (its import closure, read from the source: no import is executed), and
what each of them means.

The code units the DVC stages depend on (:mod:`noisydml.pipeline.code_digests` -> ``code/stages``, ``code/methods``,
``code/studies``) and the fingerprint that decides whether a killed run may resume (:func:`digest`) all come from
here, so both name the same files and digest them the same way: by :func:`meaning`, so that a comment, a docstring
or a layout edit changes no digest and re-runs nothing. The closure follows every ``import noisydml...`` / ``from
noisydml... import ...`` statement, at module level or inside functions, and the package ``__init__`` files Python
runs on the way. A module imported by name at run time (a method, a study, a params section's owner) is added by
whoever imports it so.
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


def meaning(path: Path) -> str:
    """What a Python file does, as text: its syntax tree re-printed (:func:`ast.unparse`) without the statements that
    are only a string (docstrings; ``__doc__`` becomes None, which only ``--help`` texts read). Comments, docstrings
    and layout are gone; every statement, name and other constant stays, so any edit that can change behaviour
    changes the text. Our choice: the printed tree depends on the Python version (3.11 here, the lock file's)."""
    tree = ast.parse(Path(path).read_text(), str(path))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            kept = [s for s in body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
                                            and isinstance(s.value.value, str))]
            node.body = kept or [ast.Pass()]
    return ast.unparse(tree)


def file_name(path: Path) -> str:
    """How a digest names a file: relative to :data:`SRC` for the package's (``noisydml/io.py``), else to the working
    directory (a stage script: ``stages/train.py``; stages run at the repository's root)."""
    path = Path(path).resolve()
    return str(path.relative_to(SRC if path.is_relative_to(SRC) else Path.cwd().resolve()))


def file_digests(paths) -> dict[str, str]:
    """``{file name: sha256 of its meaning}`` (:func:`file_name`, :func:`meaning`), sorted by name."""
    named = {file_name(p): Path(p) for p in paths}
    return {name: hashlib.sha256(meaning(named[name]).encode()).hexdigest() for name in sorted(named)}


def digest(paths) -> str:
    """One sha256 over files' names and meanings: a resumed run needs code that does the same."""
    total = hashlib.sha256()
    for name, sha in file_digests(paths).items():
        total.update(f"{name}\0{sha}\0".encode())
    return total.hexdigest()
