"""Atomic output writing: every file a stage writes appears whole or not at all.

A killed stage must never leave a half-written file that a later stage (or
DVC) mistakes for a finished one, so each writer writes a temporary file in
the destination's folder and renames it into place.

A writer killed mid-write leaves its temporary (``.<name>.<8 random>.tmp``,
or ``.<name>.old`` for a folder being replaced) beside the destination. DVC
never hashes them (``.dvcignore`` lists both patterns, so a folder that a
stage depends on hashes the same after a kill), and the next writer of the
same destination removes them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _normal_mode(path: Path, directory: bool) -> None:
    """mkstemp/mkdtemp create 0600 files and 0700 folders, and os.replace keeps the mode: give the temporary
    the mode a plain open()/mkdir() would have (0644/0755 under umask 022), so a group can read outputs."""
    os.chmod(path, (0o777 if directory else 0o666) & ~_umask())


def remove_leftovers(path: Path) -> None:
    """Remove the temporaries that killed writers of ``path`` left beside it (``tempfile``'s names: 8 characters
    of ``[a-z0-9_]``; the pattern is exact, so ``a.b``'s temporaries are not ``a``'s)."""
    if not path.parent.is_dir():
        return
    mine = re.compile(rf"\.{re.escape(path.name)}\.(?:[a-z0-9_]{{8}}\.tmp|old)")
    for leftover in path.parent.iterdir():
        if mine.fullmatch(leftover.name):
            if leftover.is_dir() and not leftover.is_symlink():
                shutil.rmtree(leftover)
            else:
                leftover.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success rename it onto ``path``."""
    path = Path(path)
    remove_leftovers(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        if tmp_path.exists():
            _normal_mode(tmp_path, directory=False)
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_json(path: str | Path, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def write_with(path: str | Path, writer: Callable[[Path], None]) -> None:
    """Atomically write ``path`` with ``writer(tmp_path)`` (np.save, torch.save, df.to_csv, savefig...)."""
    with atomic_path(path) as tmp:
        writer(tmp)


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield an empty temporary folder beside ``path``; on success it replaces ``path`` whole."""
    path = Path(path)
    remove_leftovers(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        _normal_mode(tmp, directory=True)
        if path.exists():
            old = path.with_name(f".{path.name}.old")
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old)
        else:
            os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def read_json(path: str | Path) -> Any:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; run the stage that writes it first (dvc repro)")
    return json.loads(path.read_text())
