"""Fetching a benchmark's files: resumable downloads, checksums, safe extraction, image URL lists.

- :func:`fetch_archive`: HTTP(S) download with a progress bar into ``<name>.part``, resumed with a ``Range``
  request after an interruption (and by a later run of the stage), verified against its pinned sha256 before it
  takes its final name; a mismatch deletes the partial file and says both checksums. An archive already in
  place (downloaded before, or put there by hand) is verified and used as it is: the stage is idempotent.
  When the host cannot be reached, or the dataset is given out only by its owners, the error names where to
  get the archive and the exact path to put it at.
- :func:`safe_extract`: tar (Python's ``data`` filter: no absolute paths, no ``..``, no links leaving the
  target, no device files) and zip (the same checks by hand), into a temporary folder merged into the dataset's
  files tree when complete, with a marker recording which archive (by sha256) it came from, so a re-run skips it.
- :func:`fetch_url_list`: a list of image URLs (CARS-98N): each fetched with retries, in parallel; dead links
  and files that are not images are recorded and skipped, never failing the whole list.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import shutil
import stat
import tarfile
import time
import urllib.error
import urllib.request
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pandas as pd
from tqdm import tqdm

from noisydml import io
from noisydml.data import DatasetError

CHUNK = 1 << 20
USER_AGENT = "noisydml-downloader/1"


class DownloadError(DatasetError):
    """A download that cannot be completed here; the message says what to do by hand."""


@dataclass(frozen=True)
class Archive:
    """One file a benchmark needs."""

    filename: str
    #: Where it is downloaded from; empty when only the owners give it out (then it must be put in place by hand).
    url: str = ""
    #: Pinned sha256 (or a prefix of 8+ digits, as torch hub publishes it); empty when no published checksum is
    #: known (the file's own is recorded and reported).
    sha256: str = ""
    #: Where to get it by hand when ``url`` fails or is empty.
    where: str = ""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def _by_hand(archive: Archive, dest: Path, why: str) -> DownloadError:
    where = archive.where or (f"from {archive.url}" if archive.url else "from the dataset's owners")
    return DownloadError(
        f"{archive.filename}: {why}.\nGet it {where}, put it at\n  {dest.resolve()}\nand run the stage again: "
        f"it picks the file up from there" + (f" and checks its sha256 ({archive.sha256})." if archive.sha256 else ".")
    )


def _check(path: Path, archive: Archive, keep_on_mismatch: bool) -> str:
    got = sha256_file(path)
    # a pinned prefix (torch hub names weights files by the first 8+ digits of their sha256) checks that prefix
    if archive.sha256 and not got.startswith(archive.sha256):
        if not keep_on_mismatch:
            path.unlink()
        raise DownloadError(
            f"{archive.filename}: sha256 mismatch: expected {archive.sha256}, got {got}"
            + ("" if keep_on_mismatch else "; the downloaded file was deleted (run the stage again to retry)")
            + (f" ({path} was left in place: replace it with the right file)" if keep_on_mismatch else "")
        )
    return got


def fetch_archive(archive: Archive, downloads: Path, retries: int = 3, timeout: float = 60.0,
                  progress: bool = True, backoff: float = 1.0) -> tuple[Path, str, bool]:
    """Make ``downloads/<filename>`` the archive, verified; return ``(path, sha256, verified)``.

    ``verified`` is False only when no checksum is pinned (the file's own sha256 is returned for the record)."""
    downloads.mkdir(parents=True, exist_ok=True)
    dest = downloads / archive.filename
    if dest.is_file():  # downloaded before, or put there by hand
        return dest, _check(dest, archive, keep_on_mismatch=True), bool(archive.sha256)
    if not archive.url:
        raise _by_hand(archive, dest, "it is given out only by its owners (no public download)")
    part = dest.with_name(dest.name + ".part")
    last_error = ""
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(backoff * attempt)
        have = part.stat().st_size if part.is_file() else 0
        headers = {"User-Agent": USER_AGENT, **({"Range": f"bytes={have}-"} if have else {})}
        try:
            with urllib.request.urlopen(urllib.request.Request(archive.url, headers=headers), timeout=timeout) as resp:
                resumed = have > 0 and resp.status == 206
                if not resumed:
                    have = 0  # the server sent the whole file
                length = resp.headers.get("Content-Length")
                total = have + int(length) if length is not None else None
                with open(part, "ab" if resumed else "wb") as out, tqdm(
                        total=total, initial=have, unit="B", unit_scale=True, disable=not progress,
                        desc=f"download {archive.filename}" + (" (resumed)" if resumed else "")) as bar:
                    while block := resp.read(CHUNK):
                        out.write(block)
                        bar.update(len(block))
                if total is not None and part.stat().st_size < total:
                    raise http.client.IncompleteRead(b"", total - part.stat().st_size)
            break
        except urllib.error.HTTPError as e:
            if e.code == 416 and have:  # nothing left to send: the partial file is complete
                break
            if e.code in (401, 403, 404, 410):
                raise _by_hand(archive, dest, f"{archive.url} answered HTTP {e.code} {e.reason}") from e
            last_error = f"HTTP {e.code} {e.reason}"
        except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
            # no network, a refused connection, a timeout or a cut transfer: the partial file is kept to resume
            last_error = f"{type(e).__name__}: {getattr(e, 'reason', e)}"
    else:
        kept = f" ({part.stat().st_size} bytes kept in {part.name}; a re-run resumes)" if part.is_file() else ""
        raise _by_hand(archive, dest, f"{archive.url} could not be fetched after {retries + 1} attempts "
                                      f"({last_error}){kept}")
    got = _check(part, archive, keep_on_mismatch=False)
    os.replace(part, dest)
    return dest, got, bool(archive.sha256)


def _inside(name: str) -> bool:
    """Whether an archive member's name stays inside the folder it is extracted to."""
    path = PurePosixPath(name.replace("\\", "/"))
    if path.is_absolute() or ".." in path.parts or (path.parts and ":" in path.parts[0]):
        return False
    return True


def _extract_zip(archive: Path, target: Path) -> None:
    with zipfile.ZipFile(archive) as zf:
        for info in zf.infolist():
            if not _inside(info.filename):
                raise DatasetError(f"{archive.name}: member {info.filename!r} would be written outside the target "
                                   "folder (absolute path or '..'); refusing to extract it")
            if stat.S_ISLNK(info.external_attr >> 16):
                raise DatasetError(f"{archive.name}: member {info.filename!r} is a symbolic link; refusing to "
                                   "extract links from a zip")
        zf.extractall(target)


def _extract_tar(archive: Path, target: Path) -> None:
    with tarfile.open(archive) as tf:
        try:
            tf.extractall(target, filter="data")
        except tarfile.FilterError as e:
            member = getattr(e, "tarinfo", None)
            name = member.name if member is not None else "?"
            raise DatasetError(f"{archive.name}: member {name!r} refused ({e}); an archive may not write outside "
                               "its target folder") from e


def _merge(src: Path, dest: Path) -> None:
    """Move ``src``'s entries into ``dest``, folder by folder (archives that share a top folder add to it)."""
    dest.mkdir(parents=True, exist_ok=True)
    for entry in src.iterdir():
        target = dest / entry.name
        if entry.is_dir() and not entry.is_symlink() and target.is_dir():
            _merge(entry, target)
        else:
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            os.replace(entry, target)


def safe_extract(archive: Path, tree: Path, archive_sha256: str, progress: bool = True) -> Path:
    """Extract ``archive`` (tar, tar.gz/tgz, zip) into the folder ``tree``, which several archives may share; a
    re-run with the same archive (by sha256) does nothing.

    Extraction goes to a temporary sibling folder, merged into ``tree`` when complete, and a marker
    (``tree/.extracted/<archive>.json``) is written last: a killed extraction is redone, never taken as done."""
    marker = tree / ".extracted" / f"{archive.name}.json"
    if marker.is_file() and io.read_json(marker).get("sha256") == archive_sha256:
        return tree
    tmp = tree.with_name(f".{tree.name}.{archive.name}.extracting")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    t0 = time.perf_counter()
    if progress:
        print(f"extracting {archive.name} into {tree} ...", flush=True)
    try:
        if zipfile.is_zipfile(archive):
            _extract_zip(archive, tmp)
        elif tarfile.is_tarfile(archive):
            _extract_tar(archive, tmp)
        else:
            raise DatasetError(f"{archive}: neither a zip nor a tar archive")
        _merge(tmp, tree)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    marker.parent.mkdir(parents=True, exist_ok=True)
    io.write_json(marker, {"archive": archive.name, "sha256": archive_sha256})
    if progress:
        print(f"extracted {archive.name} in {time.perf_counter() - t0:.1f}s", flush=True)
    return tree


def place_file(path: Path, tree: Path) -> Path:
    """Copy a downloaded file that is not an archive (a .mat or .txt) into the files tree."""
    tree.mkdir(parents=True, exist_ok=True)
    dest = tree / path.name
    if not dest.is_file() or dest.stat().st_size != path.stat().st_size or sha256_file(dest) != sha256_file(path):
        io.write_with(dest, lambda p: shutil.copyfile(path, p))
    return dest


def _is_image(data: bytes) -> str:
    """'' for a decodable image, else why not."""
    from io import BytesIO

    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(BytesIO(data)) as img:
            img.load()
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        return f"not an image ({type(e).__name__})"
    return ""


def _fetch_one(url: str, dest: Path, retries: int, timeout: float, backoff: float) -> tuple[str, str]:
    """``(status, detail)`` of one image URL: ok / present / dead / not_image."""
    if dest.is_file() and not _is_image(dest.read_bytes()):
        return "present", ""
    error = ""
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(backoff * attempt)
        try:
            req = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                data = resp.read()
        except urllib.error.HTTPError as e:
            error = f"HTTP {e.code}"
            if 400 <= e.code < 500 and e.code != 429:
                return "dead", error  # gone for good: no retry
            continue
        except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
            error = f"{type(e).__name__}: {getattr(e, 'reason', e)}"
            continue
        why = _is_image(data)
        if why:
            return "not_image", why
        dest.parent.mkdir(parents=True, exist_ok=True)
        io.write_with(dest, lambda p: p.write_bytes(data))
        return "ok", ""
    return "dead", error


def fetch_url_list(items: pd.DataFrame, out_dir: Path, retries: int = 2, timeout: float = 30.0, workers: int = 16,
                   progress: bool = True, backoff: float = 1.0) -> pd.DataFrame:
    """Fetch ``items`` (columns ``url``, ``path``: where it goes, relative to ``out_dir``); return them with
    ``status`` (ok, present, dead, not_image) and ``detail``. Nothing raises for a single URL."""

    def one(row):
        return _fetch_one(row.url, out_dir / row.path, retries, timeout, backoff)

    rows = list(items.itertuples(index=False))
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        results = list(tqdm(pool.map(one, rows), total=len(rows), desc="fetch images", unit="img",
                            disable=not progress))
    out = items.copy()
    out["status"] = [r[0] for r in results]
    out["detail"] = [r[1] for r in results]
    return out
