"""Where a run's images come from, and how they become network inputs.

Three stores sit behind one interface (:class:`InputPipeline`), so the trainer never knows which it has:

- **arrays**: ``(N, H, W, C)`` uint8 in memory (the embedded glyphs). Each batch is converted on the fly by
  :func:`images_to_tensor` (scaled to [-1, 1]); no augmentation. Metrics are bit-identical to
  the converted-once tensors of earlier versions (the conversion is element-wise).
- **files** (:class:`ImageFiles`): the real benchmarks. Nothing is held but the paths; every item is decoded
  when a batch needs it, in a ``torch.utils.data.DataLoader`` with ``runtime.loader_workers`` workers (pinned
  memory on CUDA), whose batch sampler is the trainer's precomputed P x K batches. With workers, each batch is
  split into one contiguous share per worker and put back together in order, so a batch -- and a method's extra
  rows, fetched in the middle of a step -- is decoded by all of them at once rather than by one; the training
  loaders' workers persist for the whole run (no process start per epoch or per step). Training inputs get the
  papers' augmentation (``RandomResizedCrop(crop, scale=(scale_min, 1))`` + horizontal flip), evaluation
  inputs ``Resize(resize)`` + ``CenterCrop(crop)``; both are normalised with the statistics the backbone's
  weights expect (``train.input.normalisation``).
- **records** (:class:`ImageRecords`): the face sets in insightface's ``train.rec``. Nothing is held but the
  records' byte offsets; each image is read and decoded when a batch needs it (the same loader and workers as
  files), then the batch is converted exactly as arrays are (:func:`images_to_tensor`, no augmentation), so a
  dataset trains the same in either store.

Augmentation is seeded per (run seed, epoch, sample id) (:func:`augmentation_seed`), inside a forked torch RNG:
the crops do not depend on the number of workers, on the batch a sample falls in, or on whether the run was
resumed, and the trainer's own RNG stream is untouched. A resumed run therefore replays the same crops and stays
bit-exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import torch

from noisydml.runtime import loader_workers

#: ImageNet channel statistics (torchvision's and timm's ImageNet weights are trained with them).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
#: (x - 0.5) / 0.5: the [-1, 1] scaling the embedded backbone is trained with (:func:`images_to_tensor`).
UNIT_MEAN = (0.5, 0.5, 0.5)
UNIT_STD = (0.5, 0.5, 0.5)
#: Eval-mode pseudo-epoch passed to the dataset: no augmentation.
EVAL = -1


def _as_rows(index):
    """An index into a store's rows as NumPy takes it: a single row stays a (one-row) subset, a tensor an array."""
    if isinstance(index, (int, np.integer)):
        return [index]
    if isinstance(index, torch.Tensor):
        return index.numpy()
    return index


class ImageFiles:
    """Image files decoded per item: ``paths`` (absolute) and ``keys`` (the manifest's sample ids, which seed each
    sample's augmentation). Indexing with an array, a mask or a slice gives the subset, as a NumPy array would."""

    channels = 3  # decoded as RGB

    def __init__(self, paths: Sequence[str] | np.ndarray, keys: Sequence[int] | np.ndarray):
        self.paths = np.asarray(paths, dtype=object)
        self.keys = np.asarray(keys, dtype=np.int64)
        if self.paths.shape != self.keys.shape or self.paths.ndim != 1:
            raise ValueError(f"ImageFiles: {self.paths.shape} paths but {self.keys.shape} keys")

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index) -> "ImageFiles":
        index = _as_rows(index)
        return ImageFiles(self.paths[index], self.keys[index])

    def __repr__(self) -> str:
        return f"ImageFiles({len(self)} files)"


class ImageRecords:
    """Images stored as the records of one MXNet RecordIO file (insightface's ``train.rec``), decoded per item from
    their byte offsets: nothing is held but the file's path and two int64 arrays (16 bytes an image; MS1MV0's 10M
    images are 160 MB of index, where decoded at 112 px they were 376 GB). ``keys``: the manifest's sample ids;
    ``size``: the side an image is resized to when its own differs (the prepared ``image_size``). Indexing gives the
    subset, as :class:`ImageFiles`."""

    channels = 3

    def __init__(self, rec_path: str | Path, offsets, keys, size: int):
        from noisydml.data.face_formats import RecordFile

        self.rec_path = Path(rec_path)
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self.keys = np.asarray(keys, dtype=np.int64)
        self.size = int(size)
        if self.offsets.shape != self.keys.shape or self.offsets.ndim != 1:
            raise ValueError(f"ImageRecords: {self.offsets.shape} offsets but {self.keys.shape} keys")
        self._file = RecordFile(self.rec_path)

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, index) -> "ImageRecords":
        index = _as_rows(index)
        return ImageRecords(self.rec_path, self.offsets[index], self.keys[index], self.size)

    def __repr__(self) -> str:
        return f"ImageRecords({len(self)} records of {self.rec_path})"

    def decode(self, row: int) -> np.ndarray:
        """Row ``row`` as ``(size, size, 3)`` uint8 RGB (bilinear when resized, as the arrays' prepare resizes)."""
        import io as _io

        from PIL import Image

        from noisydml.data.face_formats import unpack_record

        _, data = unpack_record(self._file.read_at(int(self.offsets[row])))
        try:
            with Image.open(_io.BytesIO(data)) as img:
                img = img.convert("RGB")
        except Exception as e:  # PIL raises several kinds for a broken image
            raise OSError(f"cannot decode the image of {self.rec_path}'s record at byte {int(self.offsets[row])} "
                          f"(sample {int(self.keys[row])}): {e}") from e
        if img.size != (self.size, self.size):
            img = img.resize((self.size, self.size), Image.BILINEAR)
        return np.array(img, dtype=np.uint8)  # writable: torch takes it as it is

    def decoded(self, rows=None) -> np.ndarray:
        """``(len(rows), size, size, 3)`` uint8 of ``rows`` (all by default): for the few images a page shows."""
        rows = range(len(self)) if rows is None else rows
        out = np.empty((len(rows), self.size, self.size, 3), np.uint8)
        for i, row in enumerate(rows):
            out[i] = self.decode(int(row))
        return out


def on_disk(images) -> bool:
    """Whether ``images`` are decoded per batch (:class:`ImageFiles`, :class:`ImageRecords`) rather than arrays."""
    return isinstance(images, (ImageFiles, ImageRecords))


def augmentation_seed(seed: int, epoch: int, key: int) -> int:
    """The torch seed of one sample's augmentation in one epoch of one run."""
    return int(np.random.SeedSequence([seed, epoch, int(key)]).generate_state(1)[0])


def images_to_tensor(images) -> torch.Tensor:
    """uint8 images (N, H, W, C) -> float (N, C, H, W) scaled to [-1, 1]: what every network here is fed from
    arrays (training, evaluation and pretraining alike) and from records (:class:`ImageRecords`, the same
    conversion on the decoded batch, so a dataset gives the same inputs whichever of the two stores it is in)."""
    x = images if isinstance(images, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(images))
    x = x.permute(0, 3, 1, 2).float()
    return x.div_(127.5).sub_(1.0)


def image_channels(images) -> int:
    """Channels of the network input made from ``images`` (arrays: their last axis; files: RGB)."""
    if on_disk(images):
        return images.channels
    return int(images.shape[3]) if images.ndim == 4 else int(images.shape[1])


@dataclass(frozen=True)
class InputTransform:
    """``train.input``, resolved: what a file-stored image goes through (arrays ignore it)."""

    crop: int = 224
    resize: int = 256
    scale_min: float = 0.2
    flip: bool = True
    augment: bool = True
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    #: Channels reversed to BGR after normalising (Caffe-trained weights: BN-Inception's).
    bgr: bool = False

    def build(self, train: bool):
        from torchvision.transforms import v2

        if train and self.augment:
            steps = [v2.RandomResizedCrop(self.crop, scale=(self.scale_min, 1.0), antialias=True)]
            if self.flip:
                steps.append(v2.RandomHorizontalFlip())
        else:
            steps = [v2.Resize(self.resize, antialias=True), v2.CenterCrop(self.crop)]
        steps += [v2.PILToTensor(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(list(self.mean), list(self.std))]
        if self.bgr:
            steps.append(_ToBGR())
        return v2.Compose(steps)


class _ToBGR(torch.nn.Module):
    """RGB -> BGR of a (3, H, W) tensor (Caffe-trained weights read BGR)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flip(-3)


#: BN-Inception's Caffe weights: BGR in [0, 255] minus the per-channel mean (104, 117, 128) (B, G, R), std 1;
#: as a Normalize on [0, 1] RGB before the flip to BGR.
CAFFE_MEAN, CAFFE_STD = (128 / 255, 117 / 255, 104 / 255), (1 / 255, 1 / 255, 1 / 255)


def normalisation_name(train_cfg: dict) -> str:
    """``train.input.normalisation`` resolved: ``auto`` is what the starting weights expect -- ``caffe_bgr`` for
    BN-Inception on weights (Caffe-trained), ``imagenet`` statistics for a ResNet on ImageNet weights or a weights
    file (torchvision's and timm's ResNets are trained with them), the [-1, 1] scaling of the embedded backbone
    otherwise (ours)."""
    choice = train_cfg["input"]["normalisation"]
    if choice != "auto":
        return choice
    on_weights = train_cfg["pretrained"] not in ("none", "embedded")
    if on_weights and train_cfg["backbone"] == "bn_inception":
        return "caffe_bgr"
    return "imagenet" if on_weights and train_cfg["backbone"].startswith("resnet") else "unit"


def normalisation(train_cfg: dict) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Mean and std of the resolved normalisation (:func:`normalisation_name`)."""
    return {"imagenet": (IMAGENET_MEAN, IMAGENET_STD), "caffe_bgr": (CAFFE_MEAN, CAFFE_STD),
            "unit": (UNIT_MEAN, UNIT_STD)}[normalisation_name(train_cfg)]


def input_transform(train_cfg: dict) -> InputTransform:
    cfg = train_cfg["input"]
    mean, std = normalisation(train_cfg)
    return InputTransform(crop=cfg["crop"], resize=cfg["resize"], scale_min=cfg["scale_min"], flip=cfg["flip"],
                          augment=cfg["augment"], mean=mean, std=std,
                          bgr=normalisation_name(train_cfg) == "caffe_bgr")


class _FileDataset(torch.utils.data.Dataset):
    """Items are ``(row, epoch)``: row ``row`` of ``files``, augmented for ``epoch`` (``EVAL``: not augmented)."""

    def __init__(self, files: ImageFiles, transform: InputTransform, seed: int):
        self.files, self.seed = files, seed
        self.train_transform = transform.build(train=True)
        self.eval_transform = transform.build(train=False)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, item: tuple[int, int]) -> torch.Tensor:
        row, epoch = item
        image = decode(self.files.paths[row])
        if epoch == EVAL:
            return self.eval_transform(image)
        # the sample's own seed, in a forked RNG: the crop depends on (seed, epoch, sample) only, and the
        # caller's RNG stream (the trainer's, with 0 workers) is left as it was
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(augmentation_seed(self.seed, epoch, self.files.keys[row]))
            return self.train_transform(image)


class _RecordDataset(torch.utils.data.Dataset):
    """Items are ``(row, epoch)``: row ``row`` of ``records`` decoded to ``(H, W, 3)`` uint8; the batch is then
    converted by :func:`images_to_tensor`, as arrays are (no augmentation: the arrays' protocol)."""

    def __init__(self, records: ImageRecords):
        self.records = records

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, item: tuple[int, int]) -> torch.Tensor:
        return torch.from_numpy(self.records.decode(item[0]))


def decode(path: str | Path):
    """The image at ``path`` as an RGB PIL image, fully loaded; an unreadable file names itself."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            return img.convert("RGB")
    except (UnidentifiedImageError, OSError, SyntaxError) as e:
        raise OSError(f"cannot read image {path}: {e}") from e


def _worker_init(_: int) -> None:
    # each worker decodes one image at a time: more than one torch thread per worker only oversubscribes the CPU
    torch.set_num_threads(1)


class _Batches:
    """A batch sampler whose batches are set before each pass: a persistent DataLoader keeps its workers and takes
    the next pass's batches from here."""

    def __init__(self) -> None:
        self.batches: list[list[tuple[int, int]]] = []

    def __iter__(self):
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def worker_shares(batch: list, workers: int) -> list[list]:
    """``batch`` cut into at most ``workers`` contiguous shares of near-equal size, in order."""
    parts = min(max(workers, 1), len(batch))
    bounds = np.linspace(0, len(batch), parts + 1).round().astype(int)
    return [batch[a:b] for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


@dataclass
class InputPipeline:
    """Batches of network inputs from either store (see the module docstring)."""

    transform: InputTransform = InputTransform()
    seed: int = 0
    workers: int = 0
    pin_memory: bool = False
    _persistent: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @classmethod
    def from_params(cls, train_cfg: dict, runtime: dict, seed: int, device: torch.device | None = None):
        return cls(input_transform(train_cfg), seed, loader_workers(runtime),
                   pin_memory=device is not None and device.type == "cuda")

    def _new_loader(self, files: ImageFiles | ImageRecords, batch_sampler, persistent: bool):
        dataset = (_RecordDataset(files) if isinstance(files, ImageRecords)
                   else _FileDataset(files, self.transform, self.seed))
        return torch.utils.data.DataLoader(
            dataset, batch_sampler=batch_sampler, num_workers=self.workers,
            # with workers the shares are pinned once put together (below)
            pin_memory=self.pin_memory and not self.workers and not isinstance(files, ImageRecords),
            worker_init_fn=_worker_init if self.workers else None,
            persistent_workers=persistent and self.workers > 0,
            # the loader draws a base seed per iteration (unused: crops are seeded per sample); from its own
            # generator, so the caller's RNG stream does not depend on which store the images are in
            generator=torch.Generator().manual_seed(self.seed),
        )

    def _load(self, files: ImageFiles, batches: list[list[tuple[int, int]]], purpose: str) -> Iterator[torch.Tensor]:
        """The decoded ``batches`` in order. ``purpose`` (``train``, ``extra``: persistent loaders, one per purpose
        and image store, since an extra batch is loaded while a training pass is under way; ``eval``: a loader per
        pass) picks the loader."""
        # records decode to uint8 batches, converted here as arrays are; files come transformed
        convert = images_to_tensor if isinstance(files, ImageRecords) else (lambda x: x)
        if not self.workers:
            pin_here = self.pin_memory and isinstance(files, ImageRecords)  # files are pinned by their loader
            for x in self._new_loader(files, batches, persistent=False):
                x = convert(x)
                yield x.pin_memory() if pin_here else x
            return
        shares = [worker_shares(batch, self.workers) for batch in batches]
        flat = [share for batch in shares for share in batch]
        if purpose == "eval":
            loader = self._new_loader(files, flat, persistent=False)
        else:
            key = (purpose, id(files))
            if key not in self._persistent:
                self._persistent[key] = (files, self._new_loader(files, _Batches(), persistent=True))
            loader = self._persistent[key][1]
            loader.batch_sampler.batches = flat
        parts = iter(loader)
        for batch in shares:
            x = convert(torch.cat([next(parts) for _ in batch]))
            yield x.pin_memory() if self.pin_memory else x

    def train_batches(self, images, batches: list[np.ndarray], epoch: int,
                      purpose: str = "train") -> Iterator[torch.Tensor]:
        """The inputs of ``batches`` (row indices of ``images``) of training epoch ``epoch``, in order
        (``purpose="extra"``: a method's extra rows, loaded while a ``train`` pass is under way)."""
        if not on_disk(images):
            for idx in batches:
                yield _as_input(images, idx, images_to_tensor)
            return
        yield from self._load(images, [[(int(r), epoch) for r in idx] for idx in batches], purpose)

    def eval_batches(self, images, batch_size: int) -> Iterator[torch.Tensor]:
        """Every image of ``images`` in row order, ``batch_size`` at a time, without augmentation."""
        blocks = [np.arange(i, min(i + batch_size, len(images))) for i in range(0, len(images), batch_size)]
        if not on_disk(images):
            for idx in blocks:
                yield _as_input(images, slice(int(idx[0]), int(idx[-1]) + 1), images_to_tensor)
            return
        yield from self._load(images, [[(int(r), EVAL) for r in idx] for idx in blocks], "eval")


def _as_input(images, index, convert) -> torch.Tensor:
    # arrays (N, H, W, C) uint8 are converted; a tensor is taken to be network input already (N, C, H, W)
    if isinstance(images, torch.Tensor):
        return images[index]
    return convert(images[index])
