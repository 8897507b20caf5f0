"""The embedded ``glyphs`` dataset: characters rendered offline with matplotlib's fonts.

One class is one character (Latin letters with their accented variants,
digits, Greek, Cyrillic) that every chosen face covers; one image is that
character in a random face (DejaVu Sans/Serif/Mono and STIX, all styles) with a
random rotation, scale, shift and stroke thickness. Characters that render to
(nearly) the same picture as an earlier one in every face -- Latin ``A``,
Greek ``Alpha`` and Cyrillic ``A`` share outlines -- are dropped, so no two
classes are the same picture under different labels.

Everything is drawn from one seeded generator, so the same parameters give the
same bytes.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib import ft2font
from PIL import Image, ImageFilter

#: Faces used to draw images: every style of DejaVu Sans, Serif, Mono and STIX General.
FACE_FILES = (
    "DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSans-Oblique.ttf", "DejaVuSans-BoldOblique.ttf",
    "DejaVuSerif.ttf", "DejaVuSerif-Bold.ttf", "DejaVuSerif-Italic.ttf", "DejaVuSerif-BoldItalic.ttf",
    "DejaVuSansMono.ttf", "DejaVuSansMono-Bold.ttf", "DejaVuSansMono-Oblique.ttf",
    "DejaVuSansMono-BoldOblique.ttf",
    "STIXGeneral.ttf", "STIXGeneralBol.ttf", "STIXGeneralItalic.ttf", "STIXGeneralBolIta.ttf",
)
#: Faces in which two characters must look alike for the later one to be dropped.
DEDUP_FACES = ("DejaVuSans.ttf", "DejaVuSerif.ttf", "STIXGeneral.ttf")
#: Unicode blocks the classes come from: Basic Latin, Latin-1, Latin Extended-A and -B, Greek, Cyrillic.
CODE_POINT_RANGES = ((0x30, 0x7F), (0xC0, 0x250), (0x370, 0x400), (0x400, 0x460))

CANVAS = 64  # glyphs are drawn and transformed at this size, then reduced to image_size
EM_PIXELS = 36  # font size in pixels on the canvas
DEDUP_TOLERANCE = 1.0  # mean absolute pixel difference (0..255) below which two glyphs look alike


def font_dir() -> Path:
    return Path(matplotlib.get_data_path()) / "fonts" / "ttf"


def _candidate_chars() -> list[str]:
    chars = []
    for lo, hi in CODE_POINT_RANGES:
        for cp in range(lo, hi):
            ch = chr(cp)
            cat = unicodedata.category(ch)
            if cat.startswith("L") or cat == "Nd":
                chars.append(ch)
    return chars


def _render(font: ft2font.FT2Font, ch: str) -> np.ndarray:
    """The glyph of ``ch`` centred (by its ink's bounding box) on a CANVAS x CANVAS uint8 array."""
    font.set_text(ch, 0.0)
    font.draw_glyphs_to_bitmap(antialiased=True)
    ink = np.asarray(font.get_image())
    canvas = np.zeros((CANVAS, CANVAS), np.uint8)
    ys, xs = np.nonzero(ink)
    if len(ys) == 0:
        return canvas
    ink = ink[ys.min() : ys.max() + 1, xs.min() : xs.max() + 1][:CANVAS, :CANVAS]
    h, w = ink.shape
    top, left = (CANVAS - h) // 2, (CANVAS - w) // 2
    canvas[top : top + h, left : left + w] = ink
    return canvas


@dataclass
class GlyphTemplates:
    chars: list[str]
    faces: list[str]
    #: (num_faces, num_chars, CANVAS, CANVAS) uint8
    bitmaps: np.ndarray


def load_fonts(names: tuple[str, ...]) -> list[ft2font.FT2Font]:
    fonts = []
    for name in names:
        path = font_dir() / name
        if not path.is_file():
            raise FileNotFoundError(f"glyphs: matplotlib font {path} is missing; reinstall matplotlib")
        font = ft2font.FT2Font(str(path))
        font.set_size(EM_PIXELS, 72)  # 72 dpi: points are pixels
        fonts.append(font)
    return fonts


def available_chars() -> list[str]:
    """Characters every face covers, minus those that look like an earlier one in every face."""
    fonts = load_fonts(FACE_FILES)
    covered = _candidate_chars()
    for font in fonts:
        charmap = font.get_charmap()
        covered = [c for c in covered if charmap.get(ord(c), 0) != 0]
    dedup_fonts = load_fonts(DEDUP_FACES)
    # (faces, chars, pixels) as float for the pairwise comparison
    renders = np.stack(
        [np.stack([_render(f, c) for c in covered]).reshape(len(covered), -1) for f in dedup_fonts]
    ).astype(np.float32)
    kept: list[int] = []
    for i in range(len(covered)):
        if kept:
            diffs = np.abs(renders[:, kept, :] - renders[:, i : i + 1, :]).mean(axis=2)  # (faces, kept)
            if np.any(diffs.max(axis=0) < DEDUP_TOLERANCE):
                continue
        kept.append(i)
    return [covered[i] for i in kept]


def class_name(ch: str) -> str:
    return f"U+{ord(ch):04X} {unicodedata.name(ch, '?')}"


def _augment(template: np.ndarray, rng: np.random.Generator, image_size: int) -> np.ndarray:
    """One random view of a glyph: stroke thickness, rotation, scale, shift, then downsampling."""
    img = Image.fromarray(template)
    stroke = rng.integers(0, 3)  # 0 thinner, 1 as drawn, 2 thicker (wider filters erase or blob glyphs)
    if stroke == 0:
        thinner = img.filter(ImageFilter.MinFilter(3))
        # Hairline faces (STIX italics) vanish when eroded: keep those as drawn.
        if np.asarray(thinner).max() >= 128:
            img = thinner
    elif stroke == 2:
        img = img.filter(ImageFilter.MaxFilter(3))
    angle = np.deg2rad(rng.uniform(-15, 15))
    scale = rng.uniform(0.75, 1.15)
    shift = rng.uniform(-5, 5, size=2)
    # PIL's affine maps output pixels to input pixels: the inverse of rotate+scale about the centre.
    c = CANVAS / 2
    cos, sin = np.cos(angle) / scale, np.sin(angle) / scale
    tx, ty = c + shift[0], c + shift[1]
    a, b = cos, sin
    d, e = -sin, cos
    coeffs = (a, b, c - a * tx - b * ty, d, e, c - d * tx - e * ty)
    img = img.transform((CANVAS, CANVAS), Image.Transform.AFFINE, coeffs, resample=Image.Resampling.BILINEAR)
    if image_size != CANVAS:
        img = img.resize((image_size, image_size), Image.Resampling.BOX)
    out = np.asarray(img, dtype=np.float32)
    # Stretch to full contrast: thin strokes averaged down by the resize stay visible.
    peak = out.max()
    if peak > 0:
        out *= 255.0 / peak
    return np.round(out).astype(np.uint8)


def generate(num_classes: int, images_per_class: int, image_size: int, seed: int, progress=None):
    """Render the dataset.

    Returns ``(images, labels, class_names)``: images ``(N, image_size, image_size, 1)`` uint8,
    labels ``(N,)`` int64 in ``0..num_classes-1`` ordered by class, and one name per class.
    Classes are a seeded random choice of the available characters, in a seeded random order.
    """
    chars = available_chars()
    if num_classes > len(chars):
        raise ValueError(
            f"glyphs: num_classes={num_classes}, but only {len(chars)} distinct characters are "
            f"available in every face; allowed: 4..{len(chars)}"
        )
    rng = np.random.default_rng(seed)
    chosen = [chars[i] for i in rng.permutation(len(chars))[:num_classes]]
    fonts = load_fonts(FACE_FILES)
    images = np.empty((num_classes * images_per_class, image_size, image_size, 1), np.uint8)
    labels = np.repeat(np.arange(num_classes, dtype=np.int64), images_per_class)
    for label, ch in enumerate(chosen):
        templates = [_render(f, ch) for f in fonts]
        faces = rng.integers(0, len(fonts), size=images_per_class)
        for j, face in enumerate(faces):
            images[label * images_per_class + j, :, :, 0] = _augment(templates[face], rng, image_size)
        if progress is not None:
            progress.update(1)
    return images, labels, [class_name(c) for c in chosen]
