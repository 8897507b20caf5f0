"""The embedded ``faces`` dataset: procedural identities with MS1MV0-like label noise, in the real face formats.

Nothing here is a real face, and no number measured on it says how a method fares on MS1MV0 or IJB-C: it is a
stand-in with the same *structure* (many identities, a long tail, web-crawl noise of known kinds, identity-
disjoint verification sets in insightface's formats), so that the face path of the pipeline -- readers,
protocols, noise truth -- runs offline and in CI.

**An identity** (:class:`Identity`, drawn from a seeded generator keyed by its role and number, so the roles'
identities are disjoint by construction): face width and aspect, skin tone, hair colour and style, eye spacing,
size and colour, brow thickness and slant, nose length and width, mouth width, ear size, and fixed accessories
(glasses, beard, a mole). **An image** (:class:`Nuisance`): yaw (features shift and the far side narrows; past
0.75 the far eye is hidden -- the profile mode of the CFP-FP-like set), age (hair greys, wrinkles, darker skin --
the AgeDB-like set), a lighting gradient, blur, expression (smile, open mouth, raised brows), crop jitter
(shift and scale) and the background. Drawn on a 112-pixel canvas (ArcFace's crop) and reduced to
``image_size``.

**The training set**, MS1MV0-like (:func:`training_set`): ``train_identities`` identities with a long-tailed
number of images each (log-normal around ``images_per_identity``, clipped to ``[min_images, max_images]``), then
noise, every sample's truth kept (``noise_kind``, ``true_identity``):

- ``flip``: an image labelled as another training identity (closed-set noise);
- ``distractor``: an image of an identity outside the set, under a training label (open-set noise);
- ``junk``: an image with no face (a background and shapes), under a training label;
- ``conflict``: a fraction of identities split under two labels (one person, two classes; the second label is
  a class of its own, as MS1MV0's duplicate celebrities are);
- ``duplicate``: a near-copy (pixels +-2) of a rightly labelled image, under the same label.

``variant: cleaned`` is the MS1MV2 analogue (ours): the same draw, flips, distractors, junk and duplicates
removed, conflicting labels merged back into their identity.

**Evaluation sets**, each of its own identities (:func:`verification_pairs`, :func:`ijb_set`): LFW-like (frontal
pairs), CFP-FP-like (frontal vs profile), AgeDB-like (age gap), as insightface ``.bin`` files of 10 folds,
each fold ``pairs_per_fold / 2`` genuine pairs then as many impostor pairs (LFW's ``pairs.txt`` order); and an
IJB-like 1:1 set: templates of 1-3 media of 1-3 frames each, every genuine and every impostor template pair
listed (``ijb_identities * templates_per_identity`` templates: 375 x 4 = 1,500 give 1.12M impostor pairs, so
TAR at FAR 1e-5 rests on about 11 false accepts).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image, ImageDraw, ImageFilter

CANVAS = 112
#: Ours: the root of every generator key; roles keep each set's identities apart.
SEED_ROOT = 20261127
ROLES = {"train": 0, "test": 1, "distractor": 2, "lfw": 3, "cfp_fp": 4, "agedb_30": 5, "ijb": 6, "source": 7,
         "junk": 8}
NOISE_KINDS = ("clean", "flip", "distractor", "junk", "conflict", "duplicate")
#: The verification sets and what makes their pairs hard.
VERIFICATION_SETS = ("lfw", "cfp_fp", "agedb_30")
HAIR_STYLES = ("short", "long", "bald", "fringe")


@dataclass(frozen=True)
class Identity:
    role: str
    number: int
    face_width: float
    aspect: float
    skin: tuple[float, float, float]
    hair: tuple[float, float, float]
    hair_style: str
    eye_spacing: float
    eye_size: float
    eye_colour: tuple[float, float, float]
    brow_thickness: float
    brow_slant: float
    nose_length: float
    nose_width: float
    mouth_width: float
    ear_size: float
    glasses: bool
    beard: bool
    mole: tuple[float, float] | None

    @property
    def name(self) -> str:
        return f"{self.role}{self.number:05d}"


@dataclass(frozen=True)
class Nuisance:
    yaw: float = 0.0  # -1 (left profile) .. 1 (right profile)
    age: float = 0.3  # 0 young .. 1 old
    light_angle: float = 0.0
    light_strength: float = 0.0
    blur: float = 0.0  # Gaussian radius on the canvas
    expression: float = 0.0  # -1 frown .. 1 open smile
    shift: tuple[float, float] = (0.0, 0.0)  # canvas pixels
    scale: float = 1.0
    background: tuple[int, int, int] = (128, 128, 128)


def _rng(*key: int) -> np.random.Generator:
    return np.random.default_rng([SEED_ROOT, *key])


def identity(role: str, number: int) -> Identity:
    """Identity ``number`` of ``role``: the same arguments give the same person."""
    rng = _rng(ROLES[role], number)
    skin_tone = rng.uniform(0.25, 0.95)
    skin = (0.45 + 0.5 * skin_tone, 0.3 + 0.5 * skin_tone, 0.2 + 0.45 * skin_tone * rng.uniform(0.8, 1.0))
    hair_level = rng.uniform(0.05, 0.9)
    hair = tuple(float(np.clip(hair_level * c, 0, 1)) for c in (rng.uniform(0.7, 1.3), rng.uniform(0.5, 1.0),
                                                                  rng.uniform(0.2, 0.8)))
    return Identity(
        role, number,
        face_width=rng.uniform(0.42, 0.58), aspect=rng.uniform(1.1, 1.5), skin=skin, hair=hair,
        hair_style=HAIR_STYLES[rng.integers(len(HAIR_STYLES))], eye_spacing=rng.uniform(0.32, 0.5),
        eye_size=rng.uniform(0.7, 1.3), eye_colour=tuple(rng.uniform(0.05, 0.6, 3)),
        brow_thickness=rng.uniform(1.0, 4.0), brow_slant=rng.uniform(-0.25, 0.25),
        nose_length=rng.uniform(0.12, 0.26), nose_width=rng.uniform(0.06, 0.14), mouth_width=rng.uniform(0.25, 0.5),
        ear_size=rng.uniform(0.6, 1.3), glasses=bool(rng.random() < 0.2), beard=bool(rng.random() < 0.25),
        mole=(float(rng.uniform(-0.3, 0.3)), float(rng.uniform(-0.1, 0.3))) if rng.random() < 0.3 else None,
    )


def nuisance(rng: np.random.Generator, mode: str = "frontal", base_age: float | None = None) -> Nuisance:
    """One image's conditions. ``mode``: frontal (|yaw| <= 0.35), any (|yaw| <= 0.9), profile
    (0.75 <= |yaw| <= 1); ``base_age`` fixes the age (the AgeDB-like set's young / old sides)."""
    if mode == "profile":
        yaw = rng.choice([-1.0, 1.0]) * rng.uniform(0.75, 1.0)
    else:
        yaw = rng.uniform(-0.35, 0.35) if mode == "frontal" else rng.uniform(-0.9, 0.9)
    age = rng.uniform(0.0, 0.6) if base_age is None else float(np.clip(base_age + rng.normal(0, 0.05), 0, 1))
    grey = rng.integers(60, 200)
    return Nuisance(
        yaw=float(yaw), age=float(age), light_angle=float(rng.uniform(0, 2 * np.pi)),
        light_strength=float(rng.uniform(0.0, 0.45)), blur=float(rng.choice([0.0, 0.0, rng.uniform(0.5, 2.5)])),
        expression=float(rng.uniform(-0.6, 1.0)), shift=(float(rng.normal(0, 3)), float(rng.normal(0, 3))),
        scale=float(rng.uniform(0.9, 1.1)),
        background=tuple(int(np.clip(grey + d, 0, 255)) for d in rng.integers(-40, 40, 3)),
    )


def _colour(rgb, factor: float = 1.0) -> tuple[int, int, int]:
    return tuple(int(np.clip(255 * c * factor, 0, 255)) for c in rgb)


def _mix(a, b, t: float):
    return tuple((1 - t) * x + t * y for x, y in zip(a, b))


def render(person: Identity, view: Nuisance, image_size: int) -> np.ndarray:
    """``(image_size, image_size, 3)`` uint8: ``person`` under ``view``."""
    img = Image.new("RGB", (CANVAS, CANVAS), view.background)
    d = ImageDraw.Draw(img)
    yaw, turn = view.yaw, abs(view.yaw)
    cx, cy = CANVAS / 2, CANVAS / 2 + 4
    w = CANVAS * person.face_width * (1 - 0.22 * turn) / 2
    h = w * person.aspect / (1 - 0.22 * turn)
    shift = yaw * w * 0.45  # features move towards the side the face turns to
    skin = _colour(person.skin, 1 - 0.15 * view.age)
    hair = _colour(_mix(person.hair, (0.78, 0.78, 0.78), view.age ** 1.5))
    # ears (the near side shows more), hair behind, face
    for side in (-1, 1):
        near = 1 + 0.6 * side * np.sign(yaw) * turn
        ew, eh = 5 * person.ear_size * near, 10 * person.ear_size
        ex = cx + side * w * (1 - 0.3 * turn) + shift * 0.2
        if side * yaw > -0.6:
            d.ellipse([ex - ew, cy - eh, ex + ew, cy + eh], fill=_colour(person.skin, 0.9 - 0.15 * view.age))
    if person.hair_style == "long":
        d.rectangle([cx - w * 1.1, cy - h * 0.6, cx + w * 1.1, cy + h * 0.7], fill=hair)
    if person.hair_style != "bald":
        d.ellipse([cx - w * 1.08, cy - h * 1.12, cx + w * 1.08, cy + h * 0.35], fill=hair)
    d.ellipse([cx - w, cy - h, cx + w, cy + h], fill=skin)
    if person.hair_style == "fringe":
        d.chord([cx - w, cy - h, cx + w, cy - h * 0.1], 180, 360, fill=hair)
    if person.beard:
        d.chord([cx - w * 0.95 + shift * 0.3, cy - h * 0.2, cx + w * 0.95 + shift * 0.3, cy + h], 20, 160,
                fill=hair)
    # wrinkles with age
    if view.age > 0.4:
        line = _colour(person.skin, 0.7)
        for k in range(3):
            y = cy - h * (0.55 - 0.08 * k)
            d.line([cx - w * 0.4 + shift, y, cx + w * 0.4 + shift, y], fill=line, width=1 + int(view.age > 0.75))
    # eyes and brows
    eye_y = cy - h * 0.12
    half_gap = w * person.eye_spacing * (1 - 0.3 * turn)
    raise_brow = 3 * max(view.expression, 0)
    for side in (-1, 1):
        far = side * yaw < 0
        width_scale = (1 - turn) if far else (1 + 0.15 * turn)
        if far and turn > 0.75:
            continue
        ex = cx + side * half_gap + shift
        rx, ry = 6 * person.eye_size * max(width_scale, 0.15), 3.5 * person.eye_size
        d.ellipse([ex - rx, eye_y - ry, ex + rx, eye_y + ry], fill=(245, 245, 245))
        ir = min(rx, ry) * 0.9
        d.ellipse([ex - ir + yaw * 1.5, eye_y - ir, ex + ir + yaw * 1.5, eye_y + ir], fill=_colour(person.eye_colour))
        by = eye_y - 8 - raise_brow
        slant = person.brow_slant * 8 * side
        d.line([ex - rx * 1.2, by + slant, ex + rx * 1.2, by - slant], fill=hair,
               width=max(1, int(round(person.brow_thickness))))
        if person.glasses:
            d.rectangle([ex - rx * 1.5, eye_y - 7, ex + rx * 1.5, eye_y + 7], outline=(30, 30, 30), width=2)
    if person.glasses and turn < 0.75:
        d.line([cx - half_gap + 9 + shift, eye_y, cx + half_gap - 9 + shift, eye_y], fill=(30, 30, 30), width=2)
    # nose: the tip juts out towards the turned side
    top = (cx + shift, eye_y + 2)
    tip = (cx + shift * 1.6 + yaw * 6, eye_y + h * person.nose_length * 2)
    nw = w * person.nose_width
    d.polygon([top, (tip[0] - nw, tip[1]), (tip[0] + nw, tip[1])], fill=_colour(person.skin, 0.82))
    # mouth: a smile's curve, open when the expression is strong
    mouth_y = cy + h * 0.5
    mw = w * person.mouth_width * (1 - 0.35 * turn)
    mx = cx + shift * 1.1
    lips = (150, 60, 60)
    if view.expression > 0.6:
        d.ellipse([mx - mw, mouth_y - 4, mx + mw, mouth_y + 6], fill=(70, 20, 20), outline=lips, width=2)
    else:
        bend = 6 * view.expression
        box = [mx - mw, mouth_y - 4 - abs(bend), mx + mw, mouth_y + 4 + abs(bend)]
        d.arc(box, 20 if bend >= 0 else 200, 160 if bend >= 0 else 340, fill=lips, width=2)
    if person.mole is not None:
        mx_, my_ = cx + person.mole[0] * w * 2 + shift, cy + person.mole[1] * h
        d.ellipse([mx_ - 1.5, my_ - 1.5, mx_ + 1.5, my_ + 1.5], fill=(50, 30, 20))
    return _finish(img, view, image_size)


def _finish(img: Image.Image, view: Nuisance, image_size: int) -> np.ndarray:
    """Crop jitter, lighting, blur, then the reduction to ``image_size``."""
    side = CANVAS / view.scale
    x0 = (CANVAS - side) / 2 - view.shift[0]
    y0 = (CANVAS - side) / 2 - view.shift[1]
    img = img.transform((CANVAS, CANVAS), Image.EXTENT, (x0, y0, x0 + side, y0 + side), resample=Image.BILINEAR,
                        fillcolor=view.background)
    if view.light_strength:
        ys, xs = np.mgrid[0:CANVAS, 0:CANVAS] / CANVAS - 0.5
        gain = 1 + view.light_strength * (np.cos(view.light_angle) * xs + np.sin(view.light_angle) * ys) * 2
        img = Image.fromarray(np.clip(np.asarray(img, np.float32) * gain[..., None], 0, 255).astype(np.uint8))
    if view.blur > 0:
        img = img.filter(ImageFilter.GaussianBlur(view.blur))
    if image_size != CANVAS:
        img = img.resize((image_size, image_size), Image.LANCZOS)
    return np.asarray(img, dtype=np.uint8)


def render_junk(rng: np.random.Generator, image_size: int) -> np.ndarray:
    """A crawl's non-face image: a background and random shapes."""
    view = nuisance(rng)
    img = Image.new("RGB", (CANVAS, CANVAS), view.background)
    d = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(3, 8))):
        box = sorted(rng.uniform(0, CANVAS, 2)) + sorted(rng.uniform(0, CANVAS, 2))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        (d.ellipse if rng.random() < 0.5 else d.rectangle)([box[0], box[2], box[1], box[3]], fill=colour)
    return _finish(img, replace(view, shift=(0.0, 0.0)), image_size)


# ------------------------------------------------------------------------------------------------- training set
def image_counts(rng: np.random.Generator, identities: int, mean: float, low: int, high: int) -> np.ndarray:
    """Long-tailed images per identity: log-normal (sigma 0.6, ours) around ``mean``, clipped to [low, high]."""
    counts = np.round(np.exp(rng.normal(np.log(mean), 0.6, identities))).astype(int)
    return np.clip(counts, low, high)


@dataclass
class TrainingSet:
    images: np.ndarray  # (N, S, S, 3) uint8
    labels: np.ndarray  # (N,) the noisy label (a class index)
    class_names: list[str]
    truth: pd.DataFrame  # noise_kind, true_identity (a name; "" for junk), label_name


def training_set(cfg: dict, progress=None) -> TrainingSet:
    """The MS1MV0-like training set of ``cfg`` (the ``faces`` params section), or its cleaned twin."""
    rng = _rng(ROLES["train"], cfg["seed"], 1)
    size = cfg["image_size"]
    counts = image_counts(rng, cfg["train_identities"], cfg["images_per_identity"], cfg["min_images"],
                          cfg["max_images"])
    people = [identity("train", i) for i in range(cfg["train_identities"])]
    conflicted = set(rng.choice(len(people), int(round(cfg["conflict_rate"] * len(people))), replace=False).tolist())
    images, label_names, kinds, truth_names = [], [], [], []

    def add(image, label_name, kind, true_name):
        images.append(image)
        label_names.append(label_name)
        kinds.append(kind)
        truth_names.append(true_name)

    for i, (person, n) in enumerate(zip(people, counts)):
        for j in range(n):
            view_rng = _rng(ROLES["train"], cfg["seed"], 2, i, j)
            image = render(person, nuisance(view_rng, "any"), size)
            split_off = i in conflicted and j >= n // 2  # the second label of a conflicted identity
            add(image, person.name + ("b" if split_off else ""), "conflict" if split_off else "clean", person.name)
        if progress is not None:
            progress.update(1)
    clean_count = len(images)
    noise_rng = _rng(ROLES["train"], cfg["seed"], 3)
    # closed-set flips: relabel a fraction of the images to another identity's label
    flips = noise_rng.choice(clean_count, int(round(cfg["flip_rate"] * clean_count)), replace=False)
    for k in flips:
        if kinds[k] != "clean":
            continue
        other = people[int(noise_rng.integers(len(people)))].name
        while other == truth_names[k]:
            other = people[int(noise_rng.integers(len(people)))].name
        label_names[k], kinds[k] = other, "flip"
    # open-set distractors, junk and near-duplicates, each under a training label
    rightly_labelled = [k for k in range(clean_count) if kinds[k] == "clean"]  # what near-duplicates copy
    for kind, rate in (("distractor", cfg["distractor_rate"]), ("junk", cfg["junk_rate"]),
                       ("duplicate", cfg["duplicate_rate"])):
        for m in range(int(round(rate * clean_count))):
            r = _rng(ROLES[kind if kind != "duplicate" else "train"], cfg["seed"], 4, m)
            if kind == "distractor":
                stranger = identity("distractor", int(r.integers(10 * len(people))))
                add(render(stranger, nuisance(r, "any"), size), people[int(r.integers(len(people)))].name,
                    "distractor", stranger.name)
            elif kind == "junk":
                add(render_junk(r, size), people[int(r.integers(len(people)))].name, "junk", "")
            else:
                k = int(r.choice(rightly_labelled))
                jitter = r.integers(-2, 3, images[k].shape)
                copy = np.clip(images[k].astype(int) + jitter, 0, 255).astype(np.uint8)
                add(copy, label_names[k], "duplicate", truth_names[k])
    truth = pd.DataFrame({"label_name": label_names, "noise_kind": kinds, "true_identity": truth_names})
    if cfg["variant"] == "cleaned":  # MS1MV2's analogue: noise removed, conflicting labels merged back
        keep = truth["noise_kind"].isin(["clean", "conflict"]).to_numpy()
        truth = truth[keep].reset_index(drop=True)
        truth["label_name"] = truth["true_identity"]
        truth["noise_kind"] = "clean"
        images = [im for im, k in zip(images, keep) if k]
    names = sorted(set(truth["label_name"]))
    index = {n: c for c, n in enumerate(names)}
    labels = truth["label_name"].map(index).to_numpy(np.int64)
    order = np.argsort(labels, kind="stable")  # grouped by label, as insightface's .rec files are
    return TrainingSet(np.stack(images)[order], labels[order], names, truth.iloc[order].reset_index(drop=True))


def test_set(cfg: dict) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """The identity-disjoint retrieval test split (P@1, MAP@R): ``test_identities`` x ``test_images``, clean."""
    size, images, labels = cfg["image_size"], [], []
    people = [identity("test", i) for i in range(cfg["test_identities"])]
    for i, person in enumerate(people):
        for j in range(cfg["test_images"]):
            images.append(render(person, nuisance(_rng(ROLES["test"], cfg["seed"], i, j), "any"), size))
            labels.append(i)
    return np.stack(images), np.asarray(labels, np.int64), [p.name for p in people]


# ----------------------------------------------------------------------------------------------- evaluation sets
def verification_pairs(which: str, cfg: dict) -> tuple[np.ndarray, np.ndarray, pd.DataFrame]:
    """``(images (2P, S, S, 3), issame (P,), pairs table)`` of an LFW/CFP-FP/AgeDB-like set: 10 folds, each
    ``pairs_per_fold / 2`` genuine then as many impostor pairs; identities of its own role."""
    role, size = ROLES[which], cfg["image_size"]
    per_side = cfg["pairs_per_fold"] // 2
    pool = max(2 * per_side, 20)  # identities per fold

    def views(r, first: bool):
        if which == "cfp_fp":
            return nuisance(r, "frontal" if first else "profile")
        if which == "agedb_30":
            return nuisance(r, "frontal", base_age=r.uniform(0.0, 0.25) if first else r.uniform(0.75, 1.0))
        return nuisance(r, "frontal")

    images, issame, rows = [], [], []
    for fold in range(10):
        r = _rng(role, cfg["seed"], fold)
        people = [identity(which, fold * pool + k) for k in range(pool)]
        for same in (True, False):
            for p in range(per_side):
                a = people[int(r.integers(pool))]
                b = a if same else people[int(r.integers(pool))]
                while not same and b.number == a.number:
                    b = people[int(r.integers(pool))]
                images += [render(a, views(r, True), size), render(b, views(r, False), size)]
                issame.append(same)
                rows.append({"fold": fold, "identity1": a.name, "identity2": b.name, "issame": same})
    return np.stack(images), np.asarray(issame), pd.DataFrame(rows)


def detector_score(view: Nuisance) -> float:
    """The IJB meta file's detector score of a synthetic image (ours): what a face detector's confidence tracks,
    lower for a turned head, blur and strong side light, in [0.3, 1] (IJB-C's scores spread over ~0.3-1). It weights
    the image in its template (insightface's ``use_detector_score``), so the weighting is exercised here."""
    return float(np.clip(0.99 - 0.35 * abs(view.yaw) - 0.12 * view.blur - 0.3 * view.light_strength, 0.3, 1.0))


def ijb_set(cfg: dict) -> tuple[np.ndarray, pd.DataFrame, pd.DataFrame]:
    """``(images, per-image table [image, template, media, identity, detector score], pairs [template1, template2,
    label])`` of the IJB-like set: every genuine and every impostor template pair."""
    size, images, rows = cfg["image_size"], [], []
    template = media = 0
    owner = []
    for i in range(cfg["ijb_identities"]):
        person = identity("ijb", i)
        for t in range(cfg["templates_per_identity"]):
            r = _rng(ROLES["ijb"], cfg["seed"], i, t)
            for _ in range(int(r.integers(1, 4))):  # media: a photo or a video
                base = nuisance(r, "any")
                for f in range(int(r.integers(1, 4))):  # frames of one media vary a little
                    view = replace(base, yaw=float(np.clip(base.yaw + r.normal(0, 0.05), -1, 1)),
                                   expression=float(np.clip(base.expression + r.normal(0, 0.1), -1, 1)))
                    images.append(render(person, view, size))
                    rows.append({"image": f"{len(rows)}.png", "template": template, "media": media,
                                 "identity": person.name, "score": detector_score(view)})
                media += 1
            owner.append(i)
            template += 1
    owner = np.asarray(owner)
    t1, t2 = np.triu_indices(len(owner), k=1)
    pairs = pd.DataFrame({"template1": t1, "template2": t2, "label": (owner[t1] == owner[t2]).astype(np.int64)})
    return np.stack(images), pd.DataFrame(rows), pairs


def generate_source(num_classes: int, images_per_class: int, image_size: int, seed: int, progress=None):
    """A pretraining source set of identities no dataset role uses: ``(images, labels, class_names)``."""
    images, labels = [], []
    people = [identity("source", i) for i in range(num_classes)]
    for i, person in enumerate(people):
        for j in range(images_per_class):
            images.append(render(person, nuisance(_rng(ROLES["source"], seed, i, j), "any"), image_size))
            labels.append(i)
        if progress is not None:
            progress.update(1)
    return np.stack(images), np.asarray(labels, np.int64), [p.name for p in people]


# ------------------------------------------------------------------------------------ the real layout, written
def write_source(folder: str | Path, cfg: dict, progress=None) -> dict:
    """The synthetic data in the layout of the real releases, so the readers that read real data read it:
    ``train.rec``/``train.idx`` (training identities, then the test identities), ``truth.csv`` (per record:
    noise kind and true identity), ``lfw.bin``/``cfp_fp.bin``/``agedb_30.bin`` (+ ``<set>_pairs.csv``: the
    identities of each pair), ``IJB/meta/ijb_*.txt`` + ``IJB/loose_crop/*.png`` (already aligned: the landmarks
    are ArcFace's reference points). Returns counts."""
    from noisydml.data.face_formats import ARCFACE_POINTS_112, IJBMeta, encode_png, write_face_recordio
    from noisydml.data.face_formats import write_verification_bin

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    train = training_set(cfg, progress)
    test_images, test_labels, test_names = test_set(cfg)
    names = train.class_names + test_names
    labels = np.concatenate([train.labels, test_labels + len(train.class_names)])
    encoded = [encode_png(im) for im in np.concatenate([train.images, test_images])]
    write_face_recordio(folder, labels, encoded)
    test_truth = pd.DataFrame({"label_name": [test_names[c] for c in test_labels], "noise_kind": "clean",
                               "true_identity": [test_names[c] for c in test_labels]})
    truth = pd.concat([train.truth, test_truth], ignore_index=True)
    truth.insert(0, "record", np.arange(1, len(truth) + 1))
    truth.to_csv(folder / "truth.csv", index=False)
    pd.DataFrame({"label": np.arange(len(names)), "name": names}).to_csv(folder / "identities.csv", index=False)
    counts = {"train_records": int(len(train.labels)), "test_records": int(len(test_labels))}
    for which in VERIFICATION_SETS:
        images, issame, table = verification_pairs(which, cfg)
        write_verification_bin(folder / f"{which}.bin", [encode_png(im) for im in images], issame.tolist())
        table.to_csv(folder / f"{which}_pairs.csv", index=False)
        counts[f"{which}_pairs"] = int(len(issame))
    images, table, pairs = ijb_set(cfg)
    crops = folder / "IJB" / "loose_crop"
    crops.mkdir(parents=True, exist_ok=True)
    for name, im in zip(table["image"], images):
        (crops / name).write_bytes(encode_png(im))
    points = ARCFACE_POINTS_112 * (cfg["image_size"] / 112.0)
    meta = IJBMeta(table.drop(columns="identity").assign(landmarks=[points] * len(table)), pairs)
    meta.write(folder / "IJB", "ijb")
    table.drop(columns="score").to_csv(folder / "IJB" / "identities.csv", index=False)
    counts.update(ijb_images=int(len(table)), ijb_templates=int(table["template"].nunique()),
                  ijb_genuine_pairs=int(pairs["label"].sum()), ijb_impostor_pairs=int((pairs["label"] == 0).sum()))
    return counts


# ------------------------------------------------------------------------------------------- which release it is
@dataclass(frozen=True)
class FaceRelease:
    """A face training set as insightface distributes it: the counts its ``train.rec`` declares (record 0:
    images and identities, test identities included), exact where the release's own files or its users' configs
    give them, a range where only a rounded figure is published."""

    title: str
    folder: str  #: the folder name insightface's code and mirrors use
    images: tuple[int, int]  #: inclusive range
    identities: tuple[int, int]
    basis: str

    def holds(self, images: int, identities: int) -> bool:
        return self.images[0] <= images <= self.images[1] and self.identities[0] <= identities <= self.identities[1]

    def expected(self) -> str:
        def span(r):
            return f"{r[0]:,}" if r[0] == r[1] else f"{r[0]:,}-{r[1]:,}"
        return f"{span(self.images)} images of {span(self.identities)} identities ({self.basis})"


#: The releases a ``source: local`` folder is checked against (``release``); ``unchecked`` skips the check (a set
#: of your own, labelled as such in the prepared info).
FACE_RELEASES = {
    "ms1mv0": FaceRelease("MS1MV0, the raw MS-Celeb-1M crawl (~50% noise)", "faces_ms1m_full", (8_000_000, 11_000_000),
                          (95_000, 101_000), "Sub-center ArcFace (ECCV 2020) and SGPS IV-A: ~10M images of ~100K "
                          "identities; no exact count is published, and every cleaned release has at most 5.83M "
                          "images and 93,431 identities"),
    "ms1m_refined": FaceRelease("MS1M-IBUG, the refined MS1M", "faces_ms1m", (3_804_846, 3_804_846), (84_000, 86_000),
                                "3,804,846 images in code that reads faces_ms1m_112x112; insightface's dataset zoo: "
                                "85K identities, rounded"),
    "ms1mv2": FaceRelease("MS1MV2 = MS1M-ArcFace", "faces_emore", (5_822_653, 5_822_653), (85_742, 85_742),
                          "the release's train.rec: 5,822,653 images of 85,742 identities"),
    "ms1mv3": FaceRelease("MS1MV3 = MS1M-RetinaFace", "ms1m-retinaface-t1", (5_179_510, 5_179_510), (93_431, 93_431),
                          "arcface_torch's configs/ms1mv3_*: num_image 5,179,510, num_classes 93,431"),
}
RELEASES = ("synthetic", *FACE_RELEASES, "unchecked")


def check_release(where: str, cfg: dict, images: int, identities: int) -> dict:
    """Refuse a ``train.rec`` whose declared counts are not the release ``cfg["release"]`` names, saying what was
    found, what the release holds, and which known release the counts are; returns what the prepared info
    records."""
    from noisydml.data import DatasetError

    found = {"images": int(images), "identities": int(identities)}
    if cfg["release"] in ("synthetic", "unchecked"):
        return {"release": cfg["release"], "release_counts": found}
    release = FACE_RELEASES[cfg["release"]]
    if not release.holds(images, identities):
        matches = [name for name, r in FACE_RELEASES.items() if r.holds(images, identities)]
        what = (f"those are the counts of {matches[0]!r} ({FACE_RELEASES[matches[0]].title}, insightface's "
                f"{FACE_RELEASES[matches[0]].folder})" if matches else "no known release has those counts")
        raise DatasetError(
            f"{where}: train.rec declares {images:,} images of {identities:,} identities, but release is "
            f"{cfg['release']!r} ({release.title}, insightface's {release.folder}), which has "
            f"{release.expected()}; {what}. Point local_dir at the {release.folder} folder, or set release to what "
            f"the folder holds (allowed: {', '.join(RELEASES[1:])})")
    return {"release": cfg["release"], "release_counts": found, "release_title": release.title}


# ------------------------------------------------------------------------------------------------- the prepare
#: The ``faces`` params section (a dataset kind of :mod:`noisydml.data.registry`); every default is ours.
def schema() -> dict:
    from noisydml.schema import Field

    return {
        "source": Field(str, "synthetic", choices=("synthetic", "local"),
                        help="synthetic: generated offline (this module); local: insightface's files in local_dir "
                             "(MS-Celeb-1M was withdrawn by its publisher: never downloaded)"),
        "local_dir": Field(str, "", help="source local: a folder with train.rec + train.idx and the .bin sets "
                                         "(lfw.bin, cfp_fp.bin, agedb_30.bin), as insightface's faces_emore"),
        "release": Field(str, "synthetic", choices=RELEASES,
                         help="which set local_dir must hold, checked against train.rec's counts before anything is "
                              "read (ms1mv0 = faces_ms1m_full, ms1m_refined = faces_ms1m, ms1mv2 = faces_emore, "
                              "ms1mv3 = ms1m-retinaface-t1); synthetic for source synthetic; unchecked: your own"),
        "storage": Field(str, "records", choices=("records", "arrays"),
                         help="records: the images stay in train.rec, read by byte offset per batch (nothing of "
                              "the set's size in memory; ours); arrays: decoded once into images.npy (small sets)"),
        "ijb_dir": Field(str, "", help="source local: an IJB-B/C folder (meta/, loose_crop/); '' = none"),
        "ijb_name": Field(str, "ijbc", help="source local: the meta files' prefix (ijbb, ijbc)"),
        "image_size": Field(int, 32, min=8, max=112, help="the side images are rendered or resized to (112: "
                                                           "ArcFace's crop)"),
        "variant": Field(str, "noisy", choices=("noisy", "cleaned"),
                         help="synthetic: noisy = MS1MV0-like; cleaned = its MS1MV2-like twin (noise removed, "
                              "conflicts merged)"),
        "seed": Field(int, 0, min=0),
        "train_identities": Field(int, 200, min=4),
        "images_per_identity": Field((int, float), 12, above=1, help="the long tail's median (log-normal)"),
        "min_images": Field(int, 4, min=2),
        "max_images": Field(int, 40, min=2),
        "test_identities": Field(int, 100, min=2, help="identities held out for P@1 / MAP@R (local: the last ones "
                                                       "of train.rec)"),
        "test_images": Field(int, 10, min=2, help="synthetic: images per test identity"),
        "flip_rate": Field((int, float), 0.3, min=0, max=0.9, help="closed-set flips, of the clean images"),
        "distractor_rate": Field((int, float), 0.2, min=0, max=1, help="open-set images added, of the clean ones"),
        "junk_rate": Field((int, float), 0.1, min=0, max=1, help="non-face images added, of the clean ones"),
        "conflict_rate": Field((int, float), 0.2, min=0, max=1, help="identities split under two labels"),
        "duplicate_rate": Field((int, float), 0.05, min=0, max=1, help="near-copies added, of the clean images"),
        "pairs_per_fold": Field(int, 60, min=4, help="verification pairs per fold (half genuine); LFW has 600"),
        "ijb_identities": Field(int, 375, min=2),
        "templates_per_identity": Field(int, 4, min=2),
    }


def check(cfg: dict, where: str) -> None:
    from noisydml.schema import ParamsError

    if cfg["source"] == "local" and not cfg["local_dir"]:
        raise ParamsError(f"{where}.local_dir: '' but source is 'local'; give the folder holding train.rec, "
                          "train.idx and the .bin sets")
    if cfg["source"] == "synthetic" and (cfg["local_dir"] or cfg["ijb_dir"]):
        raise ParamsError(f"{where}: local_dir/ijb_dir are read only with source: local (source is 'synthetic')")
    if (cfg["source"] == "synthetic") != (cfg["release"] == "synthetic"):
        allowed = "synthetic" if cfg["source"] == "synthetic" else ", ".join(RELEASES[1:])
        raise ParamsError(f"{where}.release: {cfg['release']!r} with source {cfg['source']!r}; allowed: {allowed} "
                          "(the release a local folder must hold is checked against its train.rec)")
    if cfg["source"] == "local" and cfg["release"] in FACE_RELEASES:
        noisy = cfg["release"] == "ms1mv0"
        if (cfg["variant"] == "noisy") != noisy:
            raise ParamsError(f"{where}.variant: {cfg['variant']!r}, but release {cfg['release']!r} is "
                              f"{'the noisy set' if noisy else 'a cleaned set'}; allowed: "
                              f"{'noisy' if noisy else 'cleaned'}")
    if cfg["pairs_per_fold"] % 2:
        raise ParamsError(f"{where}.pairs_per_fold: {cfg['pairs_per_fold']} is odd; allowed: an even number "
                          "(half genuine, half impostor)")
    if cfg["max_images"] < cfg["min_images"]:
        raise ParamsError(f"{where}.max_images: {cfg['max_images']} is below min_images ({cfg['min_images']})")


def prepare(name: str, cfg: dict, out_dir: Path, base_dir: Path, workers: int = 0) -> dict:
    """The prepared folder of a ``faces`` dataset, read through the real readers: the release check
    (:func:`check_release`, on record 0 alone), the training set from ``train.rec`` (its last ``test_identities``
    identities the retrieval test split; labels from the identity records, no image read), ``is_clean`` and
    ``noise_truth.csv`` from ``truth.csv`` where one exists (the synthetic source), the verification sets and the
    IJB set copied under ``verification/``. ``storage: records`` keeps the images in the records file (the
    synthetic one moved into the prepared folder; a local one referred to where it is); ``arrays`` decodes them
    into ``images.npy``."""
    import shutil
    import tempfile

    from tqdm import tqdm

    from noisydml import io
    from noisydml.data import DatasetError
    from noisydml.data.face_formats import FaceRecordIO, decode_images
    from noisydml.data.prepared import sha256_file, write_prepared, write_prepared_records

    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{out_dir.name}.", dir=out_dir.parent) as scratch:
        if cfg["source"] == "synthetic":
            source = Path(scratch) / "source"
            with tqdm(total=cfg["train_identities"], desc=f"prepare {name}: rendering identities",
                      unit="identity") as bar:
                counts = write_source(source, cfg, bar)
        else:
            source, counts = Path(base_dir) / cfg["local_dir"], {}
        declared = FaceRecordIO.header(source)
        if declared is None and cfg["release"] in FACE_RELEASES:
            raise DatasetError(f"{source / 'train.rec'}: no insightface header record (record 0 with the image and "
                               f"identity counts), so it cannot be checked as release {cfg['release']!r}; "
                               "allowed: an insightface training set, or release: unchecked")
        release = check_release(f"datasets.{name} ({source})", cfg, *(declared or (0, 0)))
        rec = FaceRecordIO.open(source)
        classes = np.unique(rec.labels)
        if len(classes) <= cfg["test_identities"]:
            raise DatasetError(f"{source / 'train.rec'}: {len(classes)} identities, but test_identities is "
                               f"{cfg['test_identities']}; allowed: fewer than {len(classes)}")
        labels = np.searchsorted(classes, rec.labels)
        test_from = len(classes) - cfg["test_identities"]
        split = np.where(labels < test_from, "train", "test").astype(object)
        names_file = source / "identities.csv"
        class_names = (pd.read_csv(names_file)["name"].astype(str).tolist() if names_file.is_file()
                       else [str(int(c)) for c in classes])
        truth, is_clean = None, None
        if (source / "truth.csv").is_file():
            truth = pd.read_csv(source / "truth.csv", keep_default_na=False)
            if not np.array_equal(truth["record"].to_numpy(), rec.image_keys):
                raise DatasetError(f"{source / 'truth.csv'}: its records are not train.rec's images in order")
            is_clean = truth["noise_kind"].isin(["clean", "duplicate"]).to_numpy(float)
        info = {"name": name, "kind": "faces", **cfg, "source_counts": counts, **release}
        staged = Path(scratch) / "prepared"
        if cfg["storage"] == "records":
            offsets = rec.offsets
            first = np.asarray(rec.image(0))
            rec.reader.close()
            synthetic = cfg["source"] == "synthetic"
            records_file = source / "train.rec"
            print(f"prepare {name}: sha256 of {records_file} ({records_file.stat().st_size / 2**30:.2f} GiB)")
            info = write_prepared_records(
                staged, "images.rec" if synthetic else str(Path(cfg["local_dir"]) / "train.rec"),
                "prepared" if synthetic else "base", rec.image_keys, offsets, labels, class_names, info,
                image_shape=[cfg["image_size"], cfg["image_size"], first.shape[2]],
                images_sha256=sha256_file(records_file), is_clean=is_clean, split=split,
                extra_files={"images.rec": records_file, "images.idx": source / "train.idx"} if synthetic else None)
        else:
            encoded = [rec.image_bytes(i) for i in tqdm(range(len(rec)), desc=f"prepare {name}: reading train.rec",
                                                         unit="image", mininterval=5)]
            images = decode_images(encoded, cfg["image_size"])
            info = write_prepared(staged, images, labels, class_names, info, is_clean=is_clean, split=split)
        extras = staged / "verification"
        extras.mkdir()
        if truth is not None:
            truth.drop(columns=["record"]).rename_axis("sample_id").to_csv(staged / "noise_truth.csv")
        for which in VERIFICATION_SETS:
            for suffix in (".bin", "_pairs.csv"):
                if (source / f"{which}{suffix}").is_file():
                    shutil.copy2(source / f"{which}{suffix}", extras / f"{which}{suffix}")
        ijb = source / "IJB" if cfg["source"] == "synthetic" else (Path(base_dir) / cfg["ijb_dir"]
                                                                   if cfg["ijb_dir"] else None)
        if ijb is not None:
            shutil.copytree(ijb, extras / "IJB")
            info["ijb_name"] = "ijb" if cfg["source"] == "synthetic" else cfg["ijb_name"]
            io.write_json(staged / "info.json", info)
        with io.atomic_dir(out_dir) as final:  # the whole folder appears at once, or not at all
            for item in staged.iterdir():
                shutil.move(str(item), final / item.name)
    return info
