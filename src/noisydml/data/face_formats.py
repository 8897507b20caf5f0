"""The real face-recognition data formats, read and written without MXNet or insightface.

- **MXNet RecordIO** (``train.rec`` + ``train.idx``), the form of insightface's MS1MV0/MS1MV2/Glint360K/WebFace
  training sets: records framed by dmlc-core's RecordIO (a magic word, a length word whose top 3 bits are a
  continuation flag, the payload padded to 4 bytes; a payload holding the magic word at an aligned offset is split
  around it), each image record led by MXNet's ``IRHeader`` (``flag: uint32, label: float32, id: uint64,
  id2: uint64``; ``flag > 0``: that many float32 labels follow the header). insightface's sets start with record 0,
  whose labels ``(first_identity_record, end)`` say that records ``1 .. first_identity_record - 1`` are images;
  then one record per identity with the label range ``[start, end)`` of its images. ``train.idx`` is
  ``key<TAB>byte offset`` per line.
- **insightface ``.bin`` verification sets** (LFW, CFP-FP, AgeDB-30, ...): a pickle of ``(bins, issame_list)``,
  ``bins`` the 2P encoded images of P pairs (pair ``i`` is ``bins[2i], bins[2i+1]``), loaded with
  ``pickle.load(f, encoding='bytes')`` (the published files were pickled by Python 2).
- **IJB-B / IJB-C 1:1 meta files** as insightface's ``eval_ijbc.py`` reads them: ``<set>_face_tid_mid.txt``
  (``image template_id media_id``), ``<set>_template_pair_label.txt`` (``template1 template2 label``) and
  ``<set>_name_5pts_score.txt`` (``image x1 y1 .. x5 y5 detector_score``), images under ``loose_crop/``, aligned
  to 112x112 by a similarity transform onto ArcFace's five reference points (:func:`align_face`).

Everything here is format code; which data it reads is the dataset kind's business (``noisydml.data.faces``).
"""

from __future__ import annotations

import io as _io
import pickle
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd
from PIL import Image

from noisydml.data import DatasetError

RECORDIO_MAGIC = 0xCED7230A
_MAGIC_BYTES = struct.pack("<I", RECORDIO_MAGIC)
#: MXNet's ``IRHeader`` (``mxnet/recordio.py``: ``_IR_FORMAT = 'IfQQ'``), little-endian as every x86/ARM build.
IR_HEADER = struct.Struct("<IfQQ")
_LENGTH_BITS = 29
#: Identities whose first image's own label is checked against its identity record (FaceRecordIO.open).
SPOT_CHECKS = 1000
#: ArcFace's five reference points (eyes, nose tip, mouth corners) in a 112x112 crop, as insightface aligns.
ARCFACE_POINTS_112 = np.array([[38.2946, 51.6963], [73.5318, 51.5014], [56.0252, 71.7366],
                               [41.5493, 92.3655], [70.7299, 92.2041]], dtype=np.float64)


# ----------------------------------------------------------------------------------------------- RecordIO framing
def _frame(payload: bytes) -> bytes:
    """One record in dmlc-core's framing: split around any aligned magic word (flags 1 = first part, 2 = middle,
    3 = last; 0 = whole), each part ``magic, (flag << 29) | length, bytes``, the record padded to 4 bytes."""
    parts, start = [], 0
    for i in range(0, len(payload) - len(payload) % 4, 4):
        if payload[i:i + 4] == _MAGIC_BYTES:
            flag = 1 if start == 0 else 2
            parts.append(struct.pack("<II", RECORDIO_MAGIC, (flag << _LENGTH_BITS) | (i - start)) + payload[start:i])
            start = i + 4
    flag = 3 if start else 0
    parts.append(struct.pack("<II", RECORDIO_MAGIC, (flag << _LENGTH_BITS) | (len(payload) - start))
                 + payload[start:])
    padding = (-len(payload)) % 4
    return b"".join(parts) + b"\0" * padding


def _read_record(f, where: str) -> bytes | None:
    """The next record's payload from an open file (parts joined with the magic word between them), or None at
    the end."""
    out = bytearray()
    while True:
        head = f.read(8)
        if not head:
            if out:
                raise DatasetError(f"{where}: the file ends inside a split record")
            return None
        if len(head) != 8:
            raise DatasetError(f"{where}: truncated record header at byte {f.tell() - len(head)}")
        magic, word = struct.unpack("<II", head)
        if magic != RECORDIO_MAGIC:
            raise DatasetError(f"{where}: no RecordIO magic word at byte {f.tell() - 8} (got {magic:#x}); "
                               "not an MXNet .rec file, or the .idx offsets do not belong to it")
        flag, length = word >> _LENGTH_BITS, word & ((1 << _LENGTH_BITS) - 1)
        data = f.read(length + (-length) % 4)
        if len(data) < length:
            raise DatasetError(f"{where}: truncated record at byte {f.tell() - len(data)}")
        out += data[:length]
        if flag in (0, 3):
            return bytes(out)
        out += _MAGIC_BYTES


def pack_record(label, image_bytes: bytes, record_id: int = 0) -> bytes:
    """MXNet's ``recordio.pack``: an ``IRHeader`` (``flag`` = number of float labels, 0 for a scalar label), the
    labels, then the image bytes."""
    if np.ndim(label) == 0:
        return IR_HEADER.pack(0, float(label), record_id, 0) + image_bytes
    labels = np.asarray(label, dtype="<f4").ravel()
    return IR_HEADER.pack(labels.size, 0.0, record_id, 0) + labels.tobytes() + image_bytes


def unpack_record(payload: bytes) -> tuple[np.ndarray | float, bytes]:
    """MXNet's ``recordio.unpack``: ``(label, image bytes)``; label a float, or a float32 array when flag > 0."""
    flag, label, _, _ = IR_HEADER.unpack_from(payload)
    body = payload[IR_HEADER.size:]
    if flag > 0:
        labels = np.frombuffer(body[:4 * flag], dtype="<f4").copy()
        return labels, body[4 * flag:]
    return label, body


class RecordIOWriter:
    """``train.rec`` + ``train.idx`` as MXNet's ``MXIndexedRecordIO(idx, rec, 'w')`` writes them."""

    def __init__(self, rec_path: str | Path, idx_path: str | Path):
        self._rec = open(rec_path, "wb")
        self._idx = open(idx_path, "w")

    def write(self, key: int, payload: bytes) -> None:
        self._idx.write(f"{int(key)}\t{self._rec.tell()}\n")
        self._rec.write(_frame(payload))

    def close(self) -> None:
        self._rec.close()
        self._idx.close()

    def __enter__(self) -> "RecordIOWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class RecordFile:
    """A RecordIO file read by byte offset, with no index: the handle is opened on the first read in each process
    (a copy handed to a DataLoader worker, by fork or pickle, opens its own)."""

    def __init__(self, rec_path: str | Path):
        self.rec_path = Path(rec_path)
        self._f, self._pid = None, None

    def read_at(self, offset: int) -> bytes:
        """The payload of the record that starts at byte ``offset``."""
        import os

        if self._f is None or self._pid != os.getpid():
            self._f, self._pid = open(self.rec_path, "rb"), os.getpid()
        self._f.seek(int(offset))
        payload = _read_record(self._f, str(self.rec_path))
        if payload is None:
            raise DatasetError(f"{self.rec_path}: a record offset ({offset}) is past the end of the file")
        return payload

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_f": None, "_pid": None}


class RecordIOReader:
    """Random access to ``train.rec`` through ``train.idx`` (MXNet's ``MXIndexedRecordIO(idx, rec, 'r')``).

    The index is two int64 arrays (keys sorted, their byte offsets): 16 bytes a record, 160 MB for MS1MV0's 10M,
    where a dict of Python ints took about 100 bytes a record (:class:`RecordFile` reads them)."""

    def __init__(self, rec_path: str | Path, idx_path: str | Path | None = None):
        self.rec_path = Path(rec_path)
        idx_path = Path(idx_path) if idx_path else self.rec_path.with_suffix(".idx")
        for path in (self.rec_path, idx_path):
            if not path.is_file():
                raise FileNotFoundError(f"{path}: missing (insightface's training sets come as train.rec + "
                                        "train.idx side by side)")
        table = pd.read_csv(idx_path, sep="\t", header=None, names=["key", "offset"], dtype=np.int64,
                            engine="c")
        order = np.argsort(table["key"].to_numpy(), kind="stable")
        self.index_keys = table["key"].to_numpy()[order]
        self.index_offsets = table["offset"].to_numpy()[order]
        if len(self.index_keys) > 1 and (np.diff(self.index_keys) == 0).any():
            raise DatasetError(f"{idx_path}: key {int(self.index_keys[np.flatnonzero(np.diff(self.index_keys) == 0)[0]])}"
                               " is listed twice")
        self._file = RecordFile(self.rec_path)

    def keys(self) -> list[int]:
        return self.index_keys.tolist()

    def offset(self, key: int) -> int:
        at = int(np.searchsorted(self.index_keys, key))
        if at >= len(self.index_keys) or self.index_keys[at] != key:
            raise KeyError(f"{self.rec_path}: no record {key} in its .idx")
        return int(self.index_offsets[at])

    def read(self, key: int) -> bytes:
        return self.read_at(self.offset(key))

    def read_at(self, offset: int) -> bytes:
        return self._file.read_at(offset)

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> "RecordIOReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_face_recordio(folder: str | Path, labels: np.ndarray, encoded: list[bytes]) -> None:
    """An insightface training set: record 0 (labels ``[N + 1, N + 1 + C]``), images as records ``1..N`` (label =
    identity), then one record per identity ``c`` (key ``N + 1 + c``) with its image range ``[start, end)``.
    Images must come grouped by identity, identities numbered 0..C-1, as insightface's sets are."""
    labels = np.asarray(labels, dtype=np.int64)
    n, classes = len(labels), int(labels.max()) + 1 if len(labels) else 0
    if len(encoded) != n:
        raise ValueError(f"{len(encoded)} images for {n} labels")
    if n and (np.any(np.diff(labels) < 0) or not np.array_equal(np.unique(labels), np.arange(classes))):
        raise ValueError("images must be grouped by identity with identities 0..C-1 in order")
    folder = Path(folder)
    with RecordIOWriter(folder / "train.rec", folder / "train.idx") as w:
        w.write(0, pack_record([n + 1, n + 1 + classes], b""))
        for key, (label, data) in enumerate(zip(labels, encoded), start=1):
            w.write(key, pack_record(float(label), data, key))
        starts = np.searchsorted(labels, np.arange(classes + 1)) + 1
        for c in range(classes):
            w.write(n + 1 + c, pack_record([starts[c], starts[c + 1]], b""))


@dataclass
class FaceRecordIO:
    """An insightface training set opened for reading: ``len`` images, ``labels`` per image (record ``i + 1``),
    ``offsets`` their byte offsets in ``train.rec``.

    insightface's sets (record 0 holds ``(N + 1, N + 1 + C)``) give every label from the C identity records'
    ranges: C reads, not N (100K reads for MS1MV0's 10M images). A plain indexed RecordIO (no header record) is read
    record by record."""

    reader: RecordIOReader
    image_keys: np.ndarray
    labels: np.ndarray
    #: ``(images, identities)`` that record 0 declares (None: a plain indexed RecordIO)
    declared: tuple[int, int] | None = None

    @classmethod
    def header(cls, folder: str | Path) -> tuple[int, int] | None:
        """``(images, identities)`` declared by an insightface set's record 0 (one read), or None when the file has
        no such header record."""
        with RecordIOReader(Path(folder) / "train.rec", Path(folder) / "train.idx") as reader:
            label0, _ = unpack_record(reader.read(0)) if len(reader.index_keys) and reader.index_keys[0] == 0 \
                else (None, b"")
        if label0 is None or not np.ndim(label0) or len(label0) < 2:
            return None
        first_identity, end = int(label0[0]), int(label0[1])
        return first_identity - 1, end - first_identity

    @classmethod
    def open(cls, folder: str | Path) -> "FaceRecordIO":
        folder = Path(folder)
        reader = RecordIOReader(folder / "train.rec", folder / "train.idx")
        declared = cls.header(folder)
        if declared is not None:
            images, identities = declared
            keys = np.arange(1, images + 1, dtype=np.int64)
            labels = np.full(images, -1, dtype=np.int64)
            for c in range(identities):
                bounds, _ = unpack_record(reader.read(images + 1 + c))
                start, end = int(bounds[0]), int(bounds[1])
                if not 1 <= start <= end <= images + 1:
                    raise DatasetError(f"{reader.rec_path}: identity record {images + 1 + c} gives the image range "
                                       f"[{start}, {end}), outside the {images:,} images record 0 declares")
                labels[start - 1:end - 1] = c
            if (labels < 0).any():
                raise DatasetError(f"{reader.rec_path}: image record {int(np.flatnonzero(labels < 0)[0]) + 1} is in no "
                                   "identity's range")
            # the ranges give identity c the label c, as insightface's sets number them: checked on the first image
            # of up to SPOT_CHECKS identities spread over the set (their own headers' labels)
            starts = np.flatnonzero(np.r_[True, labels[1:] != labels[:-1]])
            for at in starts[np.linspace(0, len(starts) - 1, min(SPOT_CHECKS, len(starts))).astype(int)]:
                own, _ = unpack_record(reader.read(int(keys[at])))
                own = int(own[0] if np.ndim(own) else own)
                if own != labels[at]:
                    raise DatasetError(f"{reader.rec_path}: image record {int(keys[at])} is labelled {own} in its "
                                       f"header but lies in identity {int(labels[at])}'s range")
        else:  # a plain indexed RecordIO: every record is an image, its label in its own header
            keys = reader.index_keys.copy()
            labels = np.empty(len(keys), dtype=np.int64)
            for i, key in enumerate(keys):
                label, _ = unpack_record(reader.read(int(key)))
                labels[i] = int(label[0] if np.ndim(label) else label)
        return cls(reader, keys, labels, declared)

    def __len__(self) -> int:
        return len(self.image_keys)

    @property
    def offsets(self) -> np.ndarray:
        at = np.searchsorted(self.reader.index_keys, self.image_keys)
        if (at >= len(self.reader.index_keys)).any() or (self.reader.index_keys[np.minimum(at, len(self.reader.index_keys) - 1)] != self.image_keys).any():
            raise DatasetError(f"{self.reader.rec_path}: an image record is missing from train.idx")
        return self.reader.index_offsets[at]

    def image_bytes(self, i: int) -> bytes:
        return unpack_record(self.reader.read(int(self.image_keys[i])))[1]

    def image(self, i: int) -> Image.Image:
        return Image.open(_io.BytesIO(self.image_bytes(i))).convert("RGB")

    def iter_images(self) -> Iterator[tuple[int, bytes]]:
        for i in range(len(self)):
            yield int(self.labels[i]), self.image_bytes(i)


# --------------------------------------------------------------------------------------------- .bin verification
def write_verification_bin(path: str | Path, encoded: list[bytes], issame: list[bool]) -> None:
    """An insightface ``.bin``: ``pickle.dump((bins, issame_list))``, pair ``i`` = ``bins[2i], bins[2i+1]``."""
    if len(encoded) != 2 * len(issame):
        raise ValueError(f"{len(encoded)} images for {len(issame)} pairs (need two per pair)")
    with open(path, "wb") as f:
        pickle.dump(([bytes(b) for b in encoded], [bool(s) for s in issame]), f, protocol=4)


def read_verification_bin(path: str | Path) -> tuple[list[bytes], np.ndarray]:
    """``(bins, issame)`` of an insightface ``.bin``, loaded as insightface does (``encoding='bytes'``)."""
    with open(path, "rb") as f:
        bins, issame = pickle.load(f, encoding="bytes")
    issame = np.asarray(issame, dtype=bool)
    if len(bins) != 2 * len(issame):
        raise DatasetError(f"{path}: {len(bins)} images for {len(issame)} pairs (need two per pair)")
    return list(bins), issame


def decode_images(encoded: list[bytes], size: int | None = None) -> np.ndarray:
    """Encoded images -> ``(N, H, W, 3)`` uint8, resized to ``size`` when given (the bins of one set share a
    size: 112 for insightface's)."""
    out = []
    for data in encoded:
        img = Image.open(_io.BytesIO(data)).convert("RGB")
        if size is not None and img.size != (size, size):
            img = img.resize((size, size), Image.BILINEAR)
        out.append(np.asarray(img, dtype=np.uint8))
    return np.stack(out) if out else np.zeros((0, size or 0, size or 0, 3), np.uint8)


def encode_png(image: np.ndarray) -> bytes:
    buf = _io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG", optimize=False)
    return buf.getvalue()


# ----------------------------------------------------------------------------------------------- IJB meta files
@dataclass
class IJBMeta:
    """One IJB-B/C 1:1 set: per image its template, media, landmarks and detector score; the template pairs."""

    images: pd.DataFrame  # image, template, media, landmarks (5x2 list), score
    pairs: pd.DataFrame  # template1, template2, label (1 genuine, 0 impostor)

    @classmethod
    def read(cls, root: str | Path, name: str) -> "IJBMeta":
        """``root/meta/<name>_face_tid_mid.txt`` etc., as the IJB release's insightface-converted meta files lie
        (``name``: ``ijbb`` or ``ijbc``)."""
        meta = Path(root) / "meta"
        files = {k: meta / f"{name}_{k}.txt" for k in ("face_tid_mid", "template_pair_label", "name_5pts_score")}
        for key, path in files.items():
            if not path.is_file():
                raise FileNotFoundError(f"{path}: missing; an IJB set needs meta/{name}_face_tid_mid.txt, "
                                        f"meta/{name}_template_pair_label.txt and meta/{name}_name_5pts_score.txt "
                                        "beside loose_crop/")
        tid = pd.read_csv(files["face_tid_mid"], sep=r"\s+", header=None, names=["image", "template", "media"],
                          dtype={"image": str, "template": np.int64, "media": np.int64})
        pts = pd.read_csv(files["name_5pts_score"], sep=r"\s+", header=None, dtype={0: str})
        if pts.shape[1] != 12:
            raise DatasetError(f"{files['name_5pts_score']}: expected 12 columns (image, 10 landmark "
                               f"coordinates, score), got {pts.shape[1]}")
        if len(pts) != len(tid) or not (pts[0].to_numpy() == tid["image"].to_numpy()).all():
            raise DatasetError(f"{files['name_5pts_score']} and {files['face_tid_mid']} do not list the same "
                               "images in the same order")
        tid["landmarks"] = list(pts.iloc[:, 1:11].to_numpy(np.float64).reshape(-1, 5, 2))
        tid["score"] = pts[11].to_numpy(np.float64)
        pairs = pd.read_csv(files["template_pair_label"], sep=r"\s+", header=None,
                            names=["template1", "template2", "label"], dtype=np.int64)
        unknown = set(pairs["template1"]).union(pairs["template2"]) - set(tid["template"])
        if unknown:
            raise DatasetError(f"{files['template_pair_label']}: {len(unknown)} templates have no images "
                               f"(first: {min(unknown)})")
        return cls(tid, pairs)

    def write(self, root: str | Path, name: str) -> None:
        meta = Path(root) / "meta"
        meta.mkdir(parents=True, exist_ok=True)
        self.images[["image", "template", "media"]].to_csv(meta / f"{name}_face_tid_mid.txt", sep=" ",
                                                           header=False, index=False)
        rows = [" ".join([img, *(f"{v:.4f}" for v in np.asarray(lm).ravel()), f"{s:.6f}"])
                for img, lm, s in zip(self.images["image"], self.images["landmarks"], self.images["score"])]
        (meta / f"{name}_name_5pts_score.txt").write_text("\n".join(rows) + "\n")
        self.pairs.to_csv(meta / f"{name}_template_pair_label.txt", sep=" ", header=False, index=False)


def similarity_transform(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """The least-squares similarity (rotation, uniform scale, shift) taking ``src`` points onto ``dst``
    (Umeyama 1991, Eq. 40-42), as a 2x3 matrix; what insightface's ``face_align`` estimates with scikit-image."""
    src, dst = np.asarray(src, np.float64), np.asarray(dst, np.float64)
    mu_s, mu_d = src.mean(0), dst.mean(0)
    s_c, d_c = src - mu_s, dst - mu_d
    cov = d_c.T @ s_c / len(src)
    u, sig, vt = np.linalg.svd(cov)
    sign = np.eye(2)
    if np.linalg.det(u) * np.linalg.det(vt) < 0:
        sign[1, 1] = -1
    rot = u @ sign @ vt
    scale = np.trace(np.diag(sig) @ sign) / s_c.var(0).sum()
    shift = mu_d - scale * rot @ mu_s
    return np.hstack([scale * rot, shift[:, None]])


def align_face(image: Image.Image, landmarks: np.ndarray, size: int = 112) -> np.ndarray:
    """The ``size`` x ``size`` ArcFace crop of ``image`` whose five ``landmarks`` go onto
    :data:`ARCFACE_POINTS_112` (scaled to ``size``); bilinear, black outside the image."""
    matrix = similarity_transform(landmarks, ARCFACE_POINTS_112 * (size / 112.0))
    if image.size == (size, size) and np.allclose(matrix, np.eye(2, 3), atol=1e-6):  # already aligned: exact copy
        return np.asarray(image.convert("RGB"), dtype=np.uint8)
    inverse = np.linalg.inv(np.vstack([matrix, [0, 0, 1]]))[:2]  # PIL maps output pixels to input pixels
    out = image.convert("RGB").transform((size, size), Image.AFFINE, data=tuple(inverse.ravel()),
                                         resample=Image.BILINEAR)
    return np.asarray(out, dtype=np.uint8)


def read_ijb_images(root: str | Path, meta: IJBMeta, size: int = 112, rows=None) -> np.ndarray:
    """The images ``rows`` (all by default) of an IJB set, aligned: ``root/loose_crop/<image>`` through its
    landmarks."""
    crops = Path(root) / "loose_crop"
    table = meta.images if rows is None else meta.images.iloc[rows]
    out = np.empty((len(table), size, size, 3), np.uint8)
    for i, (name, lm) in enumerate(zip(table["image"], table["landmarks"])):
        path = crops / name
        if not path.is_file():
            raise FileNotFoundError(f"{path}: missing (an IJB set's images lie in loose_crop/)")
        with Image.open(path) as img:
            out[i] = align_face(img, lm, size)
    return out
