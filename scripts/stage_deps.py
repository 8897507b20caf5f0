"""Print the noisydml source files each DVC stage imports (its code dependencies for dvc.yaml).

    python scripts/stage_deps.py            # every stage script
    python scripts/stage_deps.py train      # one

The closure follows every ``import noisydml...`` / ``from noisydml... import ...``
statement, at module level or inside functions, and the package ``__init__``
files Python runs on the way. ``tests/test_dependencies.py`` compares it with
the deps dvc.yaml declares. A train stage also imports its method's module
(``noisydml/methods/<method>.py``, loaded by name at run time).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"


def module_file(name: str) -> Path | None:
    """The file of module ``name`` under src/ (a package's ``__init__.py``), or None."""
    base = SRC.joinpath(*name.split("."))
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    return None


def _imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
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
    """Every noisydml source file that importing/running ``paths`` executes (``paths`` included)."""
    seen: set[Path] = set()
    todo = [Path(p).resolve() for p in paths]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in _imported_modules(path):
            file = module_file(name)
            if file is not None and file.resolve() not in seen:
                todo.append(file.resolve())
    return seen


def relative(paths) -> list[str]:
    return sorted(str(Path(p).resolve().relative_to(REPO)) for p in paths)


def main(argv: list[str]) -> None:
    stages = argv or sorted(p.stem for p in (REPO / "stages").glob("*.py"))
    for stage in stages:
        print(f"{stage}:")
        for path in relative(closure(REPO / "stages" / f"{stage}.py")):
            print(f"  - {path}")


if __name__ == "__main__":
    main(sys.argv[1:])
