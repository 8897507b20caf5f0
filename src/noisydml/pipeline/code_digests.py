"""The code_digests stage: what the code of each stage script, method, study and dataset means ->
``code/stages/<script>.json``, ``code/methods/<method>.json``, ``code/studies/<study>.json``,
``code/datasets/<dataset>.json`` (its kind's module: schema, download, prepare) and ``code/training/<dataset>.json``
(what the train stage runs after training on it: a face dataset's verification embeddings; empty otherwise).

A code unit is a file and the package files it runs (:func:`noisydml.closure.closure`), each with the sha256 of its
meaning (:func:`noisydml.closure.meaning`: its syntax tree without comments, docstrings or layout). Every stage of
dvc.yaml depends on its script's unit, a stage that trains a method also on that method's, one of a study's runs on
that study's, a dataset's download and prepare stages on that dataset's, a training stage on its dataset's training
unit, and the stages that read every study (evaluate, report) on the folder of study units; none depends on a
source file. The dataset units follow ``datasets.<name>.kind`` of params.yaml (a unit per dataset, as DVC's templates
name a stage's files by its item, the dataset, not by its kind). After any code edit this stage runs first (a few seconds, it trains nothing); DVC then re-runs a stage
only when one of its units' files changed, so a comment or docstring edit re-runs nothing and a change of behaviour
re-runs exactly the stages whose code runs it. DVC's templates cannot list a different set of files per matrix
item, nor hash a file by anything but its bytes: that is why the units are files of their own.

A stage script's unit also holds the modules that validate the params sections it loads (its ``SECTIONS``, with the
sections they need), which :mod:`noisydml.config` imports by name: one module per section
(:mod:`noisydml.sections`), so a change to a section's schema re-runs only the stages that load it.
"""

from __future__ import annotations

import ast
from pathlib import Path

from noisydml import io
from noisydml.closure import closure, file_digests, file_name, imported_modules, module_file
from noisydml.schema import SECTION_OWNERS

#: The stage's output folder, relative to the repository root (where the stages run).
CODE = Path("code")
#: The stage scripts' folder, relative to the repository root.
STAGE_SCRIPTS = Path("stages")
#: Each method's unit, ``<name>.json`` (what a stage training it depends on).
METHOD_CODE = CODE / "methods"
#: The stages that digest code (this one) or a tuned chain's lineage (``chain_code``): they train nothing, run first,
#: and decide which stages an edit reaches; ``dvc repro`` them before reading ``dvc status``.
DIGEST_STAGES = ("code_digests", "chain_code")
#: The kinds of unit: the folder of each under :data:`CODE`.
KINDS = ("stages", "methods", "studies", "datasets", "training")


def stage_sections(script: Path) -> tuple[str, ...] | None:
    """A stage script's ``SECTIONS`` (the params sections it loads; None: every section), read from its source."""
    for node in ast.parse(Path(script).read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "SECTIONS" for t in node.targets):
            return ast.literal_eval(node.value)
    raise ValueError(f"{script}: no SECTIONS (the params sections the stage loads; noisydml.cli)")


def section_owner_files(sections: tuple[str, ...] | None) -> list[Path]:
    """The modules that validate ``sections``, ``runtime`` and every section they need or read (each imported by
    name when a stage loads its section: :func:`noisydml.config.sections_with_needs`)."""
    from noisydml.config import sections_with_needs

    loaded = SECTION_OWNERS if sections is None else sections_with_needs(("runtime", *sections))
    return [module_file(name) for name in sorted({SECTION_OWNERS[s] for s in loaded})]


def stage_roots(script: Path) -> list[Path]:
    """The files whose closure running stage script ``script`` executes: the script and its sections' owners."""
    return [script, *section_owner_files(stage_sections(script))]


def closures(roots: dict) -> dict:
    """:func:`noisydml.closure.closure` of each entry's root files (key -> its files), each file's imports read once:
    the stage digests every unit at once, about 90 closures over the same 200 files, and reading a file's imports
    (parsing it) was most of its time. tests/test_dependencies.py checks it against :func:`closure`."""
    imports: dict[Path, set[Path]] = {}

    def imported_files(path: Path) -> set[Path]:
        if path not in imports:
            imports[path] = {file.resolve() for file in map(module_file, imported_modules(path)) if file is not None}
        return imports[path]

    result = {}
    for key, paths in roots.items():
        seen: set[Path] = set()
        todo = [Path(p).resolve() for p in paths]
        while todo:
            path = todo.pop()
            if path not in seen:
                seen.add(path)
                todo.extend(imported_files(path) - seen)
        result[key] = seen
    return result


def dataset_kinds(params_file: str | Path = "params.yaml") -> dict[str, str]:
    """Dataset name -> its kind, as params.yaml's ``datasets`` section says."""
    from noisydml.config import load_params

    return {name: body["kind"] for name, body in load_params(params_file, ("datasets",))["datasets"].items()}


def unit_roots(kind: str, name: str, scripts: Path = STAGE_SCRIPTS,
               datasets: dict[str, str] | None = None) -> list[Path]:
    """The root files of unit ``name`` of ``kind`` (one of :data:`KINDS`; its files are their closure);
    ``datasets``: dataset name -> kind (None: params.yaml's)."""
    if kind == "stages":
        return stage_roots(scripts / f"{name}.py")
    if kind in ("datasets", "training"):
        from noisydml.data.registry import KINDS_PACKAGE, dataset_kind

        kind_name = (datasets if datasets is not None else dataset_kinds())[name]
        if kind == "datasets":
            return [module_file(f"{KINDS_PACKAGE}.{kind_name}")]
        after = dataset_kind(kind_name).after_training
        return [module_file(after)] if after else []
    package = {"methods": "noisydml.methods", "studies": "noisydml.studies"}[kind]
    return [module_file(f"{package}.{name}")]


def unit_files(kind: str, name: str, scripts: Path = STAGE_SCRIPTS, datasets: dict[str, str] | None = None) -> set[Path]:
    """The files of unit ``name`` of ``kind`` (one of :data:`KINDS`): the closure of its :func:`unit_roots`."""
    return closure(*unit_roots(kind, name, scripts, datasets))


def unit_names(kind: str, scripts: Path = STAGE_SCRIPTS, datasets: dict[str, str] | None = None) -> list[str]:
    """Every unit of ``kind``: the stage scripts, the methods' catalog, the studies' catalog, params.yaml's datasets
    (``datasets``: dataset name -> kind; None: params.yaml's)."""
    if kind == "stages":
        return sorted(p.stem for p in scripts.glob("*.py"))
    if kind in ("datasets", "training"):
        return sorted(datasets if datasets is not None else dataset_kinds())
    if kind == "methods":
        from noisydml.methods import method_names

        return method_names()
    from noisydml.studies import study_names

    return study_names()


def is_digest_stage(stage: str) -> bool:
    """Whether DVC stage ``stage`` (``name`` or ``name@item``) is one of :data:`DIGEST_STAGES`."""
    return stage.split("@")[0] in DIGEST_STAGES


def unit_record(kind: str, name: str, files, digests: dict[str, str]) -> dict:
    """``{"unit": "<kind>/<name>", "files": {file: sha256 of its meaning}}`` for unit ``files``, their digests
    looked up in ``digests`` (:func:`noisydml.closure.file_digests` of them, or of more)."""
    return {"unit": f"{kind}/{name}", "files": {f: digests[f] for f in sorted(file_name(p) for p in files)}}


def code_unit(kind: str, name: str, scripts: Path = STAGE_SCRIPTS, datasets: dict[str, str] | None = None) -> dict:
    """Unit ``name`` of ``kind`` as the stage writes it (:func:`unit_record`)."""
    files = unit_files(kind, name, scripts, datasets)
    return unit_record(kind, name, files, file_digests(files))


def write_code_digests(folder: Path = CODE, scripts: Path = STAGE_SCRIPTS,
                       datasets: dict[str, str] | None = None) -> dict[str, int]:
    """Every unit of every kind (each file digested once), one folder per kind written atomically; returns how many
    of each. ``datasets``: dataset name -> kind (None: params.yaml's)."""
    datasets = datasets if datasets is not None else dataset_kinds()
    units = closures({(kind, name): unit_roots(kind, name, scripts, datasets)
                      for kind in KINDS for name in unit_names(kind, scripts, datasets)})
    digests = file_digests(set().union(*units.values()))
    written = {}
    for kind in KINDS:
        names = [name for k, name in units if k == kind]
        with io.atomic_dir(folder / kind) as tmp:
            for name in names:
                io.write_json(tmp / f"{name}.json", unit_record(kind, name, units[kind, name], digests))
        written[kind] = len(names)
    return written
