"""Rehearse a paper profile: its exact ``dvc exp run -S`` overrides, through real DVC, on a miniature stand-in.

``noisydml profile rehearse prism/table3_cars98n`` copies the working tree into a temporary
git + DVC repository, builds for every dataset of the profile a miniature in the dataset's *own* layout (CUB's
four lists, Cars196's ``cars_annos.mat``, SOP's ``Ebay_*.txt``, In-Shop's partition file, Food-101N's tsv files,
CARS-98N's URL list) and, for the weights the profile names, randomly initialised backbones saved in the
published files' key layout; serves them on 127.0.0.1; and runs ``dvc exp run`` with the profile's overrides
followed by the rehearsal's own (:func:`rehearsal_overrides`: where the files come from and their counts, one
epoch, 64-pixel crops, one seed, SGPS's subgroup generation from that epoch, ``report.rehearsal: true``). Every stage runs, from download to the papers'
tables, and fills their cells with numbers that mean nothing (the report says so). What a rehearsal proves:
the profile launches, every stage of its pipeline runs on the datasets' real formats and the weights' real key
layout, and the report fills the table's cells. Not what the numbers would be.
"""

from __future__ import annotations

import functools
import hashlib
import io as _io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

import numpy as np

#: The miniature's classes and images: one batch of 16 x 4 trains per epoch (the profiles' P x K).
TRAIN_CLASSES, TRAIN_PER_CLASS, TEST_CLASSES, TEST_PER_CLASS = 16, 4, 8, 3
#: The rehearsal's own overrides, appended after the profile's (labelled in the report as a rehearsal).
RUN_OVERRIDES = ("train.epochs=1", "train.eval_every=1", "train.input.crop=64", "train.input.resize=72",
                 "grid.seeds=[0]", "runtime.loader_workers=0", "runtime.progress=false",
                 "runtime.prepare_workers=1", "runtime.numerics=portable", "runtime.threads=1", "runtime.processes=1",
                 "report.rehearsal=true")


def jpeg_bytes(seed: int, size=(80, 60)) -> bytes:
    """A random RGB JPEG of ``size`` (width, height), the same for the same seed."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    buffer = _io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(buffer, "JPEG", quality=80)
    return buffer.getvalue()


def tar_bytes(members: dict[str, bytes], gz: bool = True) -> bytes:
    """A tar (gzip-compressed by default) of ``members`` (name -> content), built in memory."""
    buffer = _io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz" if gz else "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, _io.BytesIO(data))
    return buffer.getvalue()


def zip_bytes(members: dict[str, bytes]) -> bytes:
    """A zip of ``members`` (name -> content), built in memory."""
    buffer = _io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buffer.getvalue()


def _lines(rows: list[str]) -> bytes:
    return ("\n".join(rows) + "\n").encode()


@dataclass
class Miniature:
    """One dataset's stand-in: archive name -> bytes, extra files served at a path (CARS-98N's images), the
    counts its prepare stage must find."""

    archives: dict[str, bytes]
    expect: dict[str, int]
    served: dict[str, bytes] = field(default_factory=dict)


def _split_counts(test: str = "test") -> dict[str, int]:
    return {"train_samples": TRAIN_CLASSES * TRAIN_PER_CLASS, "train_classes": TRAIN_CLASSES,
            f"{test}_samples": TEST_CLASSES * TEST_PER_CLASS, f"{test}_classes": TEST_CLASSES}


def _classes() -> list[tuple[int, int, str]]:
    """``(class id, images, split)``: ids 1-16 train, 101-108 test (CUB's and Cars196's halves)."""
    return ([(c, TRAIN_PER_CLASS, "train") for c in range(1, TRAIN_CLASSES + 1)]
            + [(100 + c, TEST_PER_CLASS, "test") for c in range(1, TEST_CLASSES + 1)])


def cub200() -> Miniature:
    """CUB_200_2011.tgz: images/<class folder>/<file>, and its four lists (space-separated, no header)."""
    members, images, labels, split, names, n = {}, [], [], [], {}, 0
    for cid, count, _ in _classes():
        names[cid] = f"{cid:03d}.Bird_{cid}"
        for i in range(count):
            n += 1
            rel = f"{names[cid]}/Bird_{cid}_{i + 1:04d}_{n}.jpg"
            members[f"CUB_200_2011/images/{rel}"] = jpeg_bytes(n)
            images.append(f"{n} {rel}")
            labels.append(f"{n} {cid}")
            split.append(f"{n} {int(i % 2 == 0)}")
    members["CUB_200_2011/images.txt"] = _lines(images)
    members["CUB_200_2011/image_class_labels.txt"] = _lines(labels)
    members["CUB_200_2011/classes.txt"] = _lines([f"{c} {name}" for c, name in names.items()])
    members["CUB_200_2011/train_test_split.txt"] = _lines(split)
    return Miniature({"CUB_200_2011.tgz": tar_bytes(members)}, _split_counts())


def _cars_annos(rows: list[tuple[str, int, int]]) -> bytes:
    """cars_annos.mat as the devkit has it: ``annotations`` (relative_im_path, bbox, class, test), ``class_names``."""
    from scipy.io import savemat

    fields = [("relative_im_path", "O"), ("bbox_x1", "O"), ("bbox_y1", "O"), ("bbox_x2", "O"), ("bbox_y2", "O"),
              ("class", "O"), ("test", "O")]
    annotations = np.zeros((1, len(rows)), dtype=fields)
    for i, (path, cls, test) in enumerate(rows):
        box = [np.array([[v]], np.uint16) for v in (1, 1, 79, 59)]
        annotations[0, i] = (path, *box, np.array([[cls]], np.uint8), np.array([[test]], np.uint8))
    buffer = _io.BytesIO()
    savemat(buffer, {"annotations": annotations,
                     "class_names": np.array([[f"Car {c}" for c in range(1, 197)]], dtype=object)})
    return buffer.getvalue()


def cars196() -> Miniature:
    """car_ims.tgz (car_ims/<6 digits>.jpg) + cars_annos.mat; classes 1-98 train, 99-196 test."""
    members, rows = {}, []
    for cid, count, split in _classes():
        cls = cid if split == "train" else cid - 2  # 99-106
        for _ in range(count):
            path = f"car_ims/{len(rows) + 1:06d}.jpg"
            members[path] = jpeg_bytes(5000 + len(rows))
            rows.append((path, cls, int(len(rows) % 2)))
    return Miniature({"car_ims.tgz": tar_bytes(members), "cars_annos.mat": _cars_annos(rows)}, _split_counts())


def cars98n(base_url: str) -> Miniature:
    """CARS_98N_list.csv (``url,label``, no header, labels 0-97) of images served one by one, + Cars196."""
    cars = cars196()
    served, rows = {}, []
    for label in range(TRAIN_CLASSES):
        for i in range(TRAIN_PER_CLASS):
            path = f"/web/cars98n/{label}_{i}.jpg"
            served[path] = jpeg_bytes(9000 + label * 10 + i)
            rows.append(f"{base_url}{path},{label}")
    expect = {k: v for k, v in cars.expect.items() if not k.startswith("train")}
    expect.update(train_samples=TRAIN_CLASSES * TRAIN_PER_CLASS, train_classes=TRAIN_CLASSES)
    return Miniature({"CARS_98N_list.csv": _lines(rows), **cars.archives}, expect, served)


def sop() -> Miniature:
    """Stanford_Online_Products.zip: <super class>_final/<file>, Ebay_train.txt / Ebay_test.txt (a header line,
    then ``image_id class_id super_class_id path``)."""
    members, tables, n = {}, {"train": [], "test": []}, 0
    for cid, count, split in _classes():
        for i in range(count):
            n += 1
            rel = f"bicycle_final/{cid}_{i}.JPG"
            members[f"Stanford_Online_Products/{rel}"] = jpeg_bytes(n)
            tables[split].append(f"{n} {cid} 1 {rel}")
    for split, rows in tables.items():
        members[f"Stanford_Online_Products/Ebay_{split}.txt"] = _lines(["image_id class_id super_class_id path", *rows])
    return Miniature({"Stanford_Online_Products.zip": zip_bytes(members)}, _split_counts())


def inshop() -> Miniature:
    """img.zip (img/<gender>/<category>/id_<item>/<file>) + list_eval_partition.txt (a count line, a header line,
    then ``image_name item_id evaluation_status``); test items have one query and two gallery images."""
    members, lines = {}, []
    for cid, count, split in _classes():
        item = f"id_{cid:08d}"
        statuses = ["train"] * count if split == "train" else ["query", "gallery", "gallery"]
        for i, status in enumerate(statuses):
            rel = f"img/WOMEN/Dresses/{item}/{i + 1:02d}_1_front.jpg"
            members[rel] = jpeg_bytes(cid * 10 + i)
            lines.append(f"{rel}                   {item}  {status}")
    partition = _lines([str(len(lines)), "image_name item_id evaluation_status", *lines])
    expect = {"train_samples": TRAIN_CLASSES * TRAIN_PER_CLASS, "train_classes": TRAIN_CLASSES,
              "query_samples": TEST_CLASSES, "query_classes": TEST_CLASSES,
              "gallery_samples": 2 * TEST_CLASSES, "gallery_classes": TEST_CLASSES}
    return Miniature({"img.zip": zip_bytes(members), "list_eval_partition.txt": partition}, expect)


def food101n() -> Miniature:
    """Food-101N_release.zip (meta/classes.txt, imagelist.tsv, verified_{train,val}.tsv: header lines, tab
    separated; images/<class>/<file>) + food-101.tar.gz (meta/classes.txt, train.txt, test.txt; images/...).
    Food-101N's classes.txt is in its own order (cheesecake before cheese_plate). Of each class's images the first
    is verified noisy, the last unverified, the others verified clean."""
    names = [f"dish_{i:03d}" for i in range(99)]
    names[10:10] = ["cheesecake", "cheese_plate"]  # the real file's order, not Python's sorted()
    noisy, keys, verified = {"Food-101N_release/meta/classes.txt": _lines(["class_name", *names])}, [], []
    for c, name in enumerate(names[:TRAIN_CLASSES]):
        for i in range(TRAIN_PER_CLASS):
            key = f"{name}/{c}_{i}.jpg"
            noisy[f"Food-101N_release/images/{key}"] = jpeg_bytes(c * 10 + i)
            keys.append(key)
            if i != TRAIN_PER_CLASS - 1:  # the last unverified, as most of the release is: NaN is_clean
                verified.append(f"{key}\t{int(i != 0)}")  # the first verified noisy
    noisy["Food-101N_release/meta/imagelist.tsv"] = _lines(["class_name/key", *keys])
    noisy["Food-101N_release/meta/verified_train.tsv"] = _lines(["class_name/key\tverification_label", *verified[::2]])
    noisy["Food-101N_release/meta/verified_val.tsv"] = _lines(["class_name/key\tverification_label", *verified[1::2]])
    food, train_txt, test_txt = {"food-101/meta/classes.txt": _lines(sorted(names))}, [], []
    for c, name in enumerate(names[50:50 + TEST_CLASSES]):
        for i in range(TEST_PER_CLASS):
            key = f"{name}/{700 + i}"
            food[f"food-101/images/{key}.jpg"] = jpeg_bytes(3000 + c * 10 + i)
            (test_txt if i == 0 else train_txt).append(key)
    food["food-101/meta/train.txt"] = _lines(train_txt)
    food["food-101/meta/test.txt"] = _lines(test_txt)
    return Miniature({"Food-101N_release.zip": zip_bytes(noisy), "food-101.tar.gz": tar_bytes(food)}, _split_counts())


def cnwl_cars(base_url: str) -> Miniature:
    """CNWL's dataset_no_images.zip (stanford-cars-annotations.json: ``data[i][0]`` with image/id, image/uri,
    image/class/label, image/class/label/is_clean; split files of ``name label`` lines) with its web images served
    one by one, + car_ims.tgz. The level 0.4 split: per training label (0-15) two of Stanford Cars' own images,
    a web image annotated wrong and one annotated right; test: labels 98-105, clean."""
    import json

    cars, served, entries, level, clean = {}, {}, [], [], []
    for label in range(TRAIN_CLASSES):
        for i in range(TRAIN_PER_CLASS):
            if i < 2:
                name = f"{len(cars) + 1:06d}.jpg"
                cars[f"car_ims/{name}"] = jpeg_bytes(7000 + len(cars))
                clean.append(f"{name} {label}")
            else:
                image_id = f"{label:04x}{i:012x}"
                name = f"{image_id}.jpg"
                served[f"/web/cnwl/{name}"] = jpeg_bytes(8000 + label * 10 + i)
                entries.append([{"image/id": image_id, "image/uri": f"{base_url}/web/cnwl/{name}",
                                 "image/class/label": label, "image/class/label/is_clean": i == 3}])
            level.append(f"{name} {label}")
    validation = []
    for label in range(98, 98 + TEST_CLASSES):
        for i in range(TEST_PER_CLASS):
            name = f"{len(cars) + 1:06d}.jpg"
            cars[f"car_ims/{name}"] = jpeg_bytes(7000 + len(cars))
            (clean if i else validation).append(f"{name} {label}")
    release = {"dataset_no_images/stanford-cars-annotations.json": json.dumps({"data": entries}).encode(),
               "dataset_no_images/stanford_cars/split/red_noise_nl_0.4": _lines(level),
               "dataset_no_images/stanford_cars/split/red_noise_nl_0.0": _lines(clean),
               "dataset_no_images/stanford_cars/split/clean_validation": _lines(validation)}
    return Miniature({"dataset_no_images.zip": zip_bytes(release), "car_ims.tgz": tar_bytes(cars)}, _split_counts(),
                     served)


#: Per dataset kind, its miniature as a function of the local server's base URL (for images fetched by URL).
MINIATURE_BUILDERS = {"cub200": lambda base_url: cub200(), "cars196": lambda base_url: cars196(),
                      "sop": lambda base_url: sop(), "inshop": lambda base_url: inshop(),
                      "food101n": lambda base_url: food101n(), "cars98n": cars98n, "cnwl_cars": cnwl_cars}
#: The dataset kinds a rehearsal builds a miniature of (faces: synthetic identities written as insightface's files).
MINIATURE_KINDS = (*MINIATURE_BUILDERS, "faces")
#: The face miniature: identities, images and pairs enough for every protocol to score (the synthetic kind's
#: generator at 32 px), and the batch's identities (the profiles' 256 would exceed them).
FACE_MINIATURE = {"train_identities": 24, "images_per_identity": 6, "min_images": 4, "max_images": 8,
                  "test_identities": 6, "test_images": 4, "pairs_per_fold": 4, "ijb_identities": 12,
                  "templates_per_identity": 2, "image_size": 32}
FACE_BATCH_CLASSES = 8
_face_folders: dict[str, Path] = {}


def face_miniature() -> Path:
    """A folder in insightface's layout (``train.rec``/``.idx``, the ``.bin`` sets, ``truth.csv``; ``IJB/`` with
    meta files named as IJB-C's), written once per process into a temporary folder."""
    if "faces" not in _face_folders:
        from noisydml.data import faces
        from noisydml.schema import check_section

        folder = Path(tempfile.mkdtemp(prefix="noisydml-faces-miniature-"))
        faces.write_source(folder, check_section(dict(FACE_MINIATURE), faces.schema(), "face miniature"))
        for meta in (folder / "IJB" / "meta").glob("ijb_*.txt"):  # the synthetic set's prefix -> IJB-C's
            meta.rename(meta.with_name("ijbc_" + meta.name[len("ijb_"):]))
        _face_folders["faces"] = folder
    return _face_folders["faces"]


def why_not_rehearsable(profile: dict) -> str | None:
    """Why a profile (``load_profiles()[name]``) cannot be rehearsed, or None: a dataset with no miniature, or noise
    from the PRISM authors' published lists (they name the real datasets' files)."""
    from noisydml.tools.profiles import params_after

    params = params_after(profile["set"])
    for name in params["grid"]["datasets"]:
        if params["datasets"][name]["kind"] not in MINIATURE_KINDS:
            return f"dataset {name!r} is of kind {params['datasets'][name]['kind']!r}, which has no miniature"
    for noise in params["grid"]["noises"]:
        if params["noise"][noise]["kind"] == "published_list":
            return (f"noise {noise!r} is the PRISM authors' published lists, which name the real datasets' files "
                    "(a miniature has none of them)")
    return None


def miniature(kind: str, base_url: str) -> Miniature:
    if kind not in MINIATURE_BUILDERS:
        raise ValueError(f"no miniature of dataset kind {kind!r} yet; rehearsable kinds: "
                         f"{', '.join(MINIATURE_BUILDERS)}")
    return MINIATURE_BUILDERS[kind](base_url)


@functools.lru_cache(maxsize=None)
def random_weights(backbone: str) -> bytes:
    """A randomly initialised backbone saved as its published file is: BN-Inception in pretrainedmodels' key
    layout (conv weight and bias, batch norms without num_batches_tracked, the ImageNet classifier), ResNet-50 as
    torchvision's state dict (fc included)."""
    import torch

    torch.manual_seed(0)
    if backbone == "resnet50":
        import torchvision

        state = torchvision.models.resnet50(weights=None).state_dict()
    else:
        from noisydml.models import BACKBONES

        state = BACKBONES[backbone](3, {"pooling": "max"}).state_dict()
    state = {k: v for k, v in state.items() if not k.endswith("num_batches_tracked")}
    buffer = _io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


@contextmanager
def serve(files: dict[str, bytes], log: list | None = None, cut_once: set[str] | None = None) -> Iterator[str]:
    """Serve ``files`` (path -> bytes, read at each request) on 127.0.0.1 while the block runs; yields the base
    URL. Honours ``Range: bytes=N-`` (206; 416 past the end), as the download code's resume uses. ``log`` gets
    ``(path, Range header)`` of every request; a path in ``cut_once`` sends half its bytes the first time and
    drops the connection (an interrupted transfer, for the download tests)."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            byte_range = self.headers.get("Range")
            if log is not None:
                log.append((self.path, byte_range))
            data = files.get(self.path)
            if data is None:
                self.send_error(404)
                return
            start = int(byte_range.split("=")[1].split("-")[0]) if byte_range else 0
            if start >= len(data) and byte_range:
                self.send_error(416)
                return
            self.send_response(206 if byte_range else 200)
            if byte_range:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.send_header("Content-Length", str(len(data) - start))
            self.end_headers()
            if not byte_range and cut_once is not None and self.path in cut_once:
                cut_once.discard(self.path)
                self.wfile.write(data[: len(data) // 2])
                self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(data[start:])

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def rehearsal_overrides(params: dict, base_url: str, files: dict[str, bytes]) -> list[str]:
    """The rehearsal's ``-S`` arguments for ``params`` (the profile applied): each dataset's miniature and
    counts, the weights' random stand-in, then :data:`RUN_OVERRIDES`. Fills ``files`` with what to serve."""
    out = []
    for name in params["grid"]["datasets"]:
        if params["datasets"][name]["kind"] == "faces":  # read from a local folder, as the real releases are
            folder = face_miniature()
            # the miniature is not the release the profile names: its counts are checked against nothing
            out += [f"datasets.{name}.local_dir='{folder}'", f"datasets.{name}.release=unchecked",
                    f"datasets.{name}.ijb_dir='{folder / 'IJB'}'",
                    f"datasets.{name}.ijb_name=ijbc", f"datasets.{name}.image_size={FACE_MINIATURE['image_size']}",
                    f"datasets.{name}.test_identities={FACE_MINIATURE['test_identities']}",
                    f"train.batch.classes={FACE_BATCH_CLASSES}"]
            continue
        mini = miniature(params["datasets"][name]["kind"], base_url)
        archives = []
        for filename, data in mini.archives.items():
            files[f"/{name}/{filename}"] = data
            archives.append(f"{filename}: {{url: '{base_url}/{name}/{filename}', sha256: '{_sha(data)}'}}")
        files.update(mini.served)
        # new keys inside mappings params.yaml writes empty: DVC (struct mode) needs them removed, then added
        out += [f"~datasets.{name}.archives", f"+datasets.{name}.archives={{{', '.join(archives)}}}",
                f"~datasets.{name}.expect",
                f"+datasets.{name}.expect={{{', '.join(f'{k}: {v}' for k, v in mini.expect.items())}}}",
                f"datasets.{name}.local_dir=''"]
    source = params["train"]["pretrained"]
    if source in params["weights"]:
        data = random_weights(params["weights"][source]["backbone"])
        files[f"/weights/{source}.pth"] = data
        out += [f"weights.{source}.url='{base_url}/weights/{source}.pth'", f"weights.{source}.sha256='{_sha(data)}'"]
    # SGPS's subgroup generation starts at sgm.start_epoch (ours: 4): from the one epoch's start here, so it runs
    out += [f"methods.{m}.sgm.start_epoch=0" for m in params["grid"]["methods"]
            if isinstance(params["methods"].get(m), dict) and "sgm" in params["methods"][m]]
    # a tuned method's study holds out 4 of the miniature's 16 classes (the profile's count is for the real data);
    # the 12 left fill a batch of 8 classes, not the profiles' 16
    if params["tuning"]["methods"] or params["tuning"]["chains"]:
        out += [f"tuning.validation_classes={TRAIN_CLASSES // 4}", f"train.batch.classes={TRAIN_CLASSES // 2}"]
    return out + list(RUN_OVERRIDES)


def _working_copy(repo: Path, folder: Path) -> None:
    """The working tree's tracked and untracked-not-ignored files, as a fresh git + DVC repository."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=repo, check=True,
                            capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = repo / rel
        if src.is_file():
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, folder / rel)


def stage_env() -> dict[str, str]:
    """The environment for git, DVC and the stages it runs: this interpreter as ``python``, no outside MLflow
    server, a git identity when the machine has none, OpenMP threads that do not spin while waiting."""
    env = dict(os.environ)
    env.pop("MLFLOW_TRACKING_URI", None)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # stages run this `python`
    for key in ("GIT_AUTHOR_NAME", "GIT_COMMITTER_NAME"):
        env.setdefault(key, "noisydml rehearsal")
    for key in ("GIT_AUTHOR_EMAIL", "GIT_COMMITTER_EMAIL"):
        env.setdefault(key, "rehearsal@localhost")
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


def run_checked(cmd: list, cwd: Path, env: dict, timeout: float | None = None) -> str:
    """Run ``cmd``; its stdout, or a RuntimeError with the end of its output unless it exits 0."""
    cmd = [str(c) for c in cmd]
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed in {cwd}:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc.stdout


def rehearse(name: str, profile: dict, repo: str | Path = ".", folder: str | Path | None = None,
             timeout: float | None = None, extra: tuple[str, ...] = ()) -> Path:
    """Rehearse one profile (``load_profiles()[name]``) in ``folder`` (a new temporary folder if None; kept, with
    its report): returns the folder. ``extra``: more ``-S`` overrides after the rehearsal's (e.g. an opt-in stage
    that the rehearsal should exercise too)."""
    from noisydml.tools.profiles import params_after

    repo = Path(repo).resolve()
    folder = Path(folder or tempfile.mkdtemp(prefix=f"rehearse-{name.replace('/', '-')}-"))
    folder.mkdir(parents=True, exist_ok=True)
    params = params_after(profile["set"], repo / "params.yaml")
    files: dict[str, bytes] = {}
    env = stage_env()
    with serve(files) as base_url:
        overrides = rehearsal_overrides(params, base_url, files) + list(extra)
        params_after(profile["set"] + overrides, repo / "params.yaml")  # refused here, before any copying
        _working_copy(repo, folder)
        setup = [["git", "init", "-q"]]
        if not (folder / ".dvc").is_dir():  # a working tree of a DVC repository carries .dvc/config
            setup.append([sys.executable, "-m", "dvc", "init", "-q"])
        setup += [[sys.executable, "-m", "dvc", "config", "core.analytics", "false"], ["git", "add", "-A"],
                  ["git", "commit", "-qm", "rehearsal: the working tree"]]
        for cmd in setup:
            run_checked(cmd, folder, env)
        command = [sys.executable, "-m", "dvc", "exp", "run", "-n", f"rehearsal-{name.replace('/', '-')}"]
        for item in profile["set"] + overrides:
            command += ["-S", item]
        run_checked(command, folder, env, timeout)
    return folder
