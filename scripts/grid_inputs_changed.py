"""Whether any stage's own inputs differ from what dvc.lock records: CI's test of whether the committed results
still need regenerating.

A fresh clone has no DVC cache, so `dvc status` calls every stage changed: their outputs are missing. What this
asks is the question a shared DVC cache would answer: apart from outputs a stage makes, do the code, data files,
params and commands the stages read equal those the lock was made from? The digest stages run first (`dvc repro
--single-item code_digests chain_code ...`: seconds, they train nothing) and are then left out: what a stage's code
means is its code units (code/...), compared with the lock like a source file, so a comment edit is no change.
Other outputs that are missing, and dependencies that are (or hold, or lie inside) another stage's outputs, are
left to the graph: they are equal when everything upstream is. A stage missing from the lock, a changed command, a
changed params value, a changed code unit or data file, or a committed output (reports/, metrics/) that differs
from the lock's hash: changed.

Exit status: 0 and a list of what changed when the results need regenerating; 3 when nothing changed (the lock
covers the code); anything else (a crash) means "regenerate" to a caller, which is the safe reading.

    python scripts/grid_inputs_changed.py
"""

from __future__ import annotations

import argparse
import sys

from noisydml.pipeline.code_digests import is_digest_stage
from noisydml.tools.console import run_digest_stages
from noisydml.tools.guard import is_data

UNCHANGED = 3
#: `dvc status` words for an output that is simply not here (a fresh clone): not a change of any input.
ABSENT = ("deleted", "not in cache")


def made_by_stages(repo) -> list[str]:
    """The paths stages write (their ``outs``) but the digest stages', relative to the repository root."""
    return [str(out.def_path).rstrip("/") for stage in repo.index.stages if not is_digest_stage(stage.addressing)
            for out in stage.outs]


def changed_inputs(status: dict, outputs: list[str]) -> list[str]:
    """The lines of `dvc status --json` that are a change of some stage's own input, as ``stage: what``."""
    changes = []
    for stage, entries in status.items():
        if is_digest_stage(stage):
            continue  # its dependencies are the source files' bytes; what they mean is its outputs
        for entry in entries:
            if isinstance(entry, str):  # "changed checksum", "always changed", a new stage, ...
                changes.append(f"{stage}: {entry}")
                continue
            for kind, items in entry.items():
                if not isinstance(items, dict):
                    changes.append(f"{stage}: {kind} {items}")
                    continue
                for path, state in items.items():
                    if isinstance(state, dict):  # a params file: {key: "modified" | "new" | "deleted"}
                        changes += [f"{stage}: {kind} {path}:{key} {how}" for key, how in state.items()]
                    elif kind == "changed deps" and is_data(path, outputs):
                        continue  # made by a stage upstream: equal when its inputs are
                    elif kind == "changed outs" and state in ABSENT:
                        continue  # not here in a fresh clone
                    else:
                        changes.append(f"{stage}: {kind} {path} {state}")
    return changes


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    from dvc.repo import Repo, lock_repo

    run_digest_stages()
    with Repo(".") as repo, lock_repo(repo):  # `dvc status --json`'s own call, on the index loaded once
        outputs = made_by_stages(repo)
        stages = len(repo.index.stages)
        changes = changed_inputs(repo.status(), outputs)
    if changes:
        print(f"{len(changes)} input(s) of the {stages} stages differ from dvc.lock:")
        for line in changes[:40]:
            print(f"  {line}")
        if len(changes) > 40:
            print(f"  ... and {len(changes) - 40} more")
        return 0
    print(f"the code, params, commands and source files of all {stages} stages are those dvc.lock was made from")
    return UNCHANGED


if __name__ == "__main__":
    sys.exit(main())
