"""Print the noisydml source files each DVC stage imports (its code dependencies for dvc.yaml).

    python scripts/stage_deps.py                    # every stage script
    python scripts/stage_deps.py train              # one
    python scripts/stage_deps.py --update-dvc-yaml  # rewrite the code deps in dvc.yaml

The closure follows every ``import noisydml...`` / ``from noisydml... import ...``
statement, at module level or inside functions, and the package ``__init__``
files Python runs on the way. ``tests/test_dependencies.py`` compares it with
the deps dvc.yaml declares. A train stage also imports its method's module
(``noisydml/methods/<method>.py``, loaded by name at run time).
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
sys.path.insert(0, str(SRC))

from noisydml.closure import closure as _closure, module_file  # noqa: E402 - the package from this checkout
from noisydml.schema import SECTION_OWNERS  # noqa: E402


def stage_sections(script: Path) -> tuple[str, ...] | None:
    """A stage script's ``SECTIONS`` (the params sections it loads; None: every section), read from its source."""
    for node in ast.parse(script.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "SECTIONS" for t in node.targets):
            return ast.literal_eval(node.value)
    raise ValueError(f"{script}: no SECTIONS (the params sections the stage loads; noisydml.cli)")


def section_owner_files(sections) -> list[Path]:
    """The modules that validate ``sections`` and ``runtime`` (imported by name when a stage loads them; their
    ``needs`` are loaded too, and owned by these same modules or by noisydml.config)."""
    names = set(SECTION_OWNERS.values()) if sections is None else {SECTION_OWNERS[s] for s in ("runtime", *sections)}
    return [module_file(name) for name in sorted(names)]


def closure(*paths: Path) -> set[Path]:
    """Every noisydml source file that running ``paths`` executes: the import closure, and for a stage script the
    owners of the params sections it loads (imported by name)."""
    owners = [f for p in paths if Path(p).resolve().parent == (REPO / "stages").resolve()
              for f in section_owner_files(stage_sections(Path(p)))]
    return _closure(*paths, *owners)


def relative(paths) -> list[str]:
    return sorted(str(Path(p).resolve().relative_to(REPO)) for p in paths)


#: A stage's command runs ``python stages/<script>.py ...``.
STAGE_SCRIPT = re.compile(r"\bstages/([A-Za-z_]\w*)\.py\b")


def stage_bodies(path: Path = REPO / "dvc.yaml") -> dict[str, dict]:
    """Each stage of dvc.yaml (a template's ``do`` body for a ``foreach``/``matrix`` one), by name."""
    import yaml

    return {name: body.get("do", body) for name, body in yaml.safe_load(path.read_text())["stages"].items()}


def script_of(body: dict) -> str:
    """The stage script a dvc.yaml stage runs (``train_chain`` runs ``stages/train.py``), read from its command:
    a new stage template needs no entry anywhere else."""
    found = STAGE_SCRIPT.findall(body["cmd"])
    if len(set(found)) != 1:
        raise ValueError(f"command {body['cmd']!r}: expected one stages/<script>.py, found {found}")
    return found[0]
#: A study's own module, e.g. ``src/noisydml/studies/bspml.py`` (a stage of that study's runs imports it by name).
STUDY_MODULE = re.compile(r"^src/noisydml/studies/[A-Za-z_]\w*\.py$")
#: The folder dep of a stage that imports every study by name (evaluate, report).
STUDIES = "src/noisydml/studies"
#: The folder dep of the stage that digests every method's code (method_code: it imports each method by name).
METHODS = "src/noisydml/methods"


def study_modules() -> list[Path]:
    """Every study's module (imported by name at run time, so not in an import closure)."""
    return sorted(p for p in (REPO / STUDIES).glob("*.py") if p.stem not in ("__init__", "base"))


#: A stage's first line in dvc.yaml: ``  <name>:``, maybe with a YAML anchor (``  train: &train_stage``).
STAGE_LINE = re.compile(r"^  ([A-Za-z_][\w-]*):(\s+&[\w-]+)?\s*$")


def update_dvc_yaml(path: Path = REPO / "dvc.yaml") -> bool:
    """Rewrite the code deps (src/..., stages/...) of every stage of dvc.yaml to its closure; True if changed.

    Templated deps (``${...}``), a study's module named outright (``src/noisydml/studies/bspml.py``) and the
    folder deps standing for what a stage imports by name (``src/noisydml/studies``, ``src/noisydml/methods``) are
    kept as they are."""
    lines = path.read_text().splitlines(keepends=True)
    bodies = stage_bodies(path)
    out, stage, i = [], None, 0
    while i < len(lines):
        line = lines[i]
        match = STAGE_LINE.match(line)
        if match:
            stage = match.group(1)
        out.append(line)
        if line.strip() == "deps:" and stage:
            indent = line[: len(line) - len(line.lstrip())] + "  "
            j = i + 1
            kept, named_studies, every_study, every_method = [], [], False, False
            while j < len(lines) and lines[j].startswith(indent + "- "):
                dep = lines[j].strip()[2:]
                if STUDY_MODULE.match(dep) and not dep.endswith(("/__init__.py", "/base.py")):
                    named_studies.append(lines[j])
                    j += 1
                    continue
                if dep == STUDIES:
                    every_study = True
                if dep == METHODS:
                    every_method = True
                if dep.startswith(("src/", "stages/")) and "${" not in dep and dep not in (STUDIES, METHODS):
                    j += 1
                    continue
                kept.append(lines[j])
                j += 1
            script = REPO / "stages" / f"{script_of(bodies[stage])}.py"
            studies = [REPO / line.strip()[2:] for line in named_studies]
            if every_study:  # the stage imports every study by name (src/noisydml/studies, a folder dep)
                studies += study_modules()
            code = relative(closure(script, *studies))  # a named study's module: its imports are the stage's too
            if every_study:  # the folder dep stands for every file in it
                code = [f for f in code if not f.startswith(STUDIES + "/")]
            if every_method:  # the folder dep stands for every file in it
                code = [f for f in code if not f.startswith(METHODS + "/")]
            kept = [line for line in named_studies if line.strip()[2:] not in code] + kept
            out += [f"{indent}- {f}\n" for f in code] + kept
            i = j
            continue
        i += 1
    text = "".join(out)
    changed = text != path.read_text()
    path.write_text(text)
    return changed


def main(argv: list[str]) -> None:
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return
    unknown = [a for a in argv if a != "--update-dvc-yaml" and not (REPO / "stages" / f"{a}.py").is_file()]
    if unknown:
        known = sorted(p.stem for p in (REPO / "stages").glob("*.py"))
        sys.exit(f"error: no stage script {unknown[0]!r} (stages/{unknown[0]}.py); allowed: {', '.join(known)}")
    if argv == ["--update-dvc-yaml"]:
        print("dvc.yaml updated" if update_dvc_yaml() else "dvc.yaml already up to date")
        return
    stages = argv or sorted(p.stem for p in (REPO / "stages").glob("*.py"))
    for stage in stages:
        print(f"{stage}:")
        for path in relative(closure(REPO / "stages" / f"{stage}.py")):
            print(f"  - {path}")


if __name__ == "__main__":
    main(sys.argv[1:])
