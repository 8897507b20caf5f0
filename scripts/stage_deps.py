"""Print the code units the DVC stages depend on: the package files each stage script, method, study or dataset
runs.

    python scripts/stage_deps.py                 # every stage script's unit
    python scripts/stage_deps.py train           # one stage script's
    python scripts/stage_deps.py --methods prism # a method's (--studies bspml: a study's)
    python scripts/stage_deps.py --datasets cub  # a dataset's kind (--training faces: what training on it runs after)

These are the files the code_digests stage digests into code/<kind>/<name>.json (noisydml.pipeline.code_digests):
a stage's code dependency in dvc.yaml is its script's unit (code/stages/<script>.json), never a source file.
The closure follows every ``import noisydml...`` statement, at module level or inside functions, the package
``__init__`` files Python runs on the way, and the modules validating the params sections a script loads.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from noisydml.closure import file_name  # noqa: E402 - the package from this checkout
from noisydml.pipeline.code_digests import stage_sections, unit_files, unit_names  # noqa: E402,F401

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


def main(argv: list[str]) -> None:
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return
    import os

    os.chdir(REPO)  # stage scripts are named relative to the repository's root, where DVC runs them
    kind = "stages"
    if argv and argv[0] in ("--methods", "--studies", "--datasets", "--training"):
        kind, argv = argv[0][2:], argv[1:]
    known = unit_names(kind, REPO / "stages")
    unknown = [a for a in argv if a not in known]
    if unknown:
        sys.exit(f"error: no {kind} unit {unknown[0]!r}; allowed: {', '.join(known)}")
    for name in argv or known:
        print(f"{kind}/{name}:")
        for path in sorted(file_name(p) for p in unit_files(kind, name, REPO / "stages")):
            print(f"  - {path}")


if __name__ == "__main__":
    main(sys.argv[1:])
