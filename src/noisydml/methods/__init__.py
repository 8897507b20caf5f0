"""The method catalog: a method is a module ``noisydml/methods/<name>.py`` with a ``SPEC``.

The catalog lists method names from the files in this folder, without importing
them, and imports only the module of the method a stage asks for. So a train
stage depends on its own method's file (plus ``base.py`` and the shared
building blocks in ``parts/``), and adding a method file re-runs no other
method's stages.

To add a method: write ``methods/<name>.py`` defining ``SPEC = MethodSpec(...)``
(subclass :class:`noisydml.methods.base.Method`), add ``methods.<name>`` with
its hyper-parameters to params.yaml, and the name to a grid.
"""

from __future__ import annotations

from pathlib import Path

from noisydml.catalog import load_member, names_in
from noisydml.schema import PER_NOISE, ParamsError, merged

#: Modules of this package that are not methods.
_NOT_METHODS = {"__init__", "base"}


def method_names() -> list[str]:
    """Every method of the catalog: the ``*.py`` files of this folder, sorted."""
    return names_in(Path(__file__).parent, _NOT_METHODS)


def load_spec(name: str):
    """The :class:`~noisydml.methods.base.MethodSpec` of method ``name`` (imports its module only)."""
    return load_member("noisydml.methods", name, method_names(), "SPEC", "method")


def check_method(params: dict, name: str, where: str | None = None) -> dict:
    """Validate ``methods.<name>`` of params (defaults filled in) and store it back; return it. Its
    :data:`PER_NOISE` entries are validated as the sections they make (the section with each noise's overrides),
    and kept (which noise names exist is a cross-section rule: tools/check.py)."""
    spec, where = load_spec(name), where or f"methods.{name}"
    section = dict(params["methods"].get(name) or {})
    per_noise = section.pop(PER_NOISE, None)
    checked = spec.check(section, where)
    if per_noise is not None:
        if not isinstance(per_noise, dict) or not all(isinstance(v, dict) for v in per_noise.values()):
            raise ParamsError(f"{where}.{PER_NOISE}: {per_noise!r}; allowed: a mapping noise setting -> "
                              f"{{hyper-parameter: value}} (e.g. {{prism_sym20: {{forget_rate: 0.2}}}})")
        for noise, overrides in per_noise.items():
            spec.check(merged(section, overrides), f"{where}.{PER_NOISE}.{noise}")
        checked[PER_NOISE] = {noise: dict(overrides) for noise, overrides in per_noise.items()}
    params["methods"][name] = checked
    return checked


def check_frozen_backbone(hparams: dict, train: dict, where: str) -> None:
    """A method that freezes the backbone (``freeze_backbone: true``) needs a pretrained one: a frozen random
    backbone makes its features, and the run, meaningless."""
    if hparams.get("freeze_backbone") and train["pretrained"] == "none":
        raise ParamsError(f"{where}.freeze_backbone: true freezes a randomly initialised backbone (train.pretrained: "
                          "none); allowed: false here, or train.pretrained: embedded | imagenet")


def build_method(name: str, setup):
    return load_spec(name).build(setup)
