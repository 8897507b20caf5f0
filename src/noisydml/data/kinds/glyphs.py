"""Dataset kind ``glyphs``: characters rendered offline from matplotlib's fonts (:mod:`noisydml.data.glyphs`), the
first half of the classes training, the second half testing."""

from __future__ import annotations

from noisydml.data import glyphs
from noisydml.data.registry import embedded_kind

KIND = embedded_kind("glyphs", glyphs.generate, "distinct characters", 400, 423)
