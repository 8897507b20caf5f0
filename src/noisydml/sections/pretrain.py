"""``pretrain``: the embedded backbone pretraining (``train.pretrained: embedded``)."""

from __future__ import annotations

from typing import Any, Mapping

from noisydml.schema import Field, ParamsError, SectionCheck, check_section


#: The pretrain stage (``train.pretrained: embedded``): the backbone learns to classify an embedded source set
#: disjoint from every class of its dataset: source glyphs (:func:`noisydml.data.glyphs.source_chars`), source
#: motifs (:func:`noisydml.data.motifs.source_genera`) or source identities (:func:`noisydml.data.faces.generate_source`).
#: The classes each source set has: 567 characters matplotlib's fonts give (18 s to count, so checked by this bound
#: and tested against the count), 576 motif species (144 source genera x 4); faces are procedural (ours: a bound).
PRETRAIN_SOURCE_CLASSES = {"glyphs": 567, "motifs": 576, "faces": 100000}


PRETRAIN_SCHEMA = {
    "source": Field(str, "glyphs", choices=tuple(PRETRAIN_SOURCE_CLASSES),
                    help="the embedded source set: glyphs (grey characters) | motifs (RGB shapes) | faces "
                         "(identities no faces dataset has)"),
    "classes": Field(int, 400, min=2, help="source classes (at most the source set's: glyphs 567, motifs 576)"),
    "images_per_class": Field(int, 32, min=6, help="rendered views per source character (4 held out)"),
    "image_size": Field(int, 32, min=8, help="side of the source images"),
    "epochs": Field(int, 15, min=1),
    "batch_size": Field(int, 128, min=2),
    "lr": Field(float, 0.002, above=0.0, help="Adam, cosine schedule"),
    "weight_decay": Field(float, 0.0001, min=0.0),
    "seed": Field(int, 0, min=0),
}


def _check_pretrain(section: Any, p: dict[str, Any], raw: Mapping[str, Any]) -> dict[str, Any]:
    pretrain = check_section(section, PRETRAIN_SCHEMA, "pretrain")
    available = PRETRAIN_SOURCE_CLASSES[pretrain["source"]]
    if pretrain["classes"] > available:
        raise ParamsError(f"pretrain.classes: {pretrain['classes']} is above the maximum {available} (the "
                          f"{pretrain['source']} source set's classes); allowed: 2..{available}")
    return pretrain


#: The section this module validates (:data:`noisydml.schema.SECTION_OWNERS`).
SECTION_CHECKS: dict[str, SectionCheck] = {
    "pretrain": SectionCheck(_check_pretrain),
}
