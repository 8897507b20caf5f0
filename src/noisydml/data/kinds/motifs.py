"""Dataset kind ``motifs``: RGB shapes generated offline (:mod:`noisydml.data.motifs`), fine-grained (species of a
genus differ by colour and pattern only), with the generator's difficulty as keys (ours): the defaults are the
``motifs`` dataset."""

from __future__ import annotations

from noisydml.data import motifs
from noisydml.data.registry import embedded_kind
from noisydml.schema import Field, ParamsError


def _check(cfg: dict, where: str) -> None:
    available = motifs.max_classes(species_per_genus=cfg["species_per_genus"])
    if cfg["num_classes"] > available:
        raise ParamsError(f"{where}.num_classes: {cfg['num_classes']}, but {available} species exist at "
                          f"species_per_genus {cfg['species_per_genus']}; allowed: 4..{available}")


#: 144 genera x species_per_genus species (noisydml.data.motifs.max_classes; a test checks the bound)
MOST_CLASSES = motifs.max_classes(species_per_genus=motifs.MAX_SPECIES_PER_GENUS)
GENERATOR = {
    "species_per_genus": Field(int, motifs.SPECIES_PER_GENUS, min=2, max=motifs.MAX_SPECIES_PER_GENUS,
                               help="ours: species of one genus (one shape), their hues 1/k of the circle "
                                    "apart; patterns cycle over 4, so past 4 siblings share a pattern"),
    "hue_jitter": Field(float, motifs.HUE_JITTER, min=0.0, max=1.0,
                        help="ours: std of every image's hue turn (body and parts alike, as a fraction of "
                             "the circle); past ~0.25 hue is a nuisance, not a cue"),
    "whole_genera": Field(bool, False, help="ours: draw whole genera (every species of num_classes / "
                                            "species_per_genus shapes), so siblings meet in the test half"),
}
KIND = embedded_kind("motifs", motifs.generate, "species (fine-grained classes)", 200, MOST_CLASSES, GENERATOR,
                     _check)
