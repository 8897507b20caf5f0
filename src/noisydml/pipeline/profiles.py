"""Paper profiles: the ``dvc exp run -S`` arguments that reproduce one paper table (``profiles/<paper>.yaml``).

A profile's ``set`` is the list of ``-S`` arguments exactly as DVC applies them (Hydra's override grammar: ``+`` adds
a key params.yaml lacks, ``~key`` removes one, a mapping value is merged into the mapping it replaces); lists
inside it (YAML anchors of shared settings) are flattened. With it: the table it reproduces, its number of runs and
the GPU hours per run the estimate is made from. ``python scripts/paper_profile.py`` lists them, checks them
through DVC's own override code and prints (or runs) the command. No stage imports this module.
"""

from __future__ import annotations

import shlex
import shutil
import tempfile
from pathlib import Path
from typing import Any

import yaml

from noisydml.schema import ParamsError


#: What an annotated setting of a profile says: ``{set: '<-S argument>', paper, authors, why}``.
SETTING_KEYS = ("set", "paper", "authors", "why")
#: ``-S`` arguments under these keys change what is computed, so a profile must say where each comes from.
ANNOTATED_PREFIXES = ("train.", "methods.", "evaluate.", "datasets.", "+noise.", "+chains.")


def _flatten(items: Any, where: str) -> list[str | dict]:
    """A profile's ``set``: ``-S`` arguments (plain strings: pipeline mechanics) and annotated settings
    (:data:`SETTING_KEYS`), with lists (YAML anchors of shared settings) flattened."""
    if not isinstance(items, list):
        raise ParamsError(f"{where}: expected a list of -S arguments, got {items!r}")
    out: list[str | dict] = []
    for item in items:
        if isinstance(item, list):
            out += _flatten(item, where)
        elif isinstance(item, dict):
            if set(item) != set(SETTING_KEYS) or not all(isinstance(v, str) for v in item.values()):
                raise ParamsError(f"{where}: {item!r}: an annotated setting has exactly the string keys "
                                  f"{', '.join(SETTING_KEYS)}")
            out.append(item)
        elif isinstance(item, str):
            if item.startswith(ANNOTATED_PREFIXES):
                raise ParamsError(f"{where}: {item!r} changes what is computed: write it as "
                                  "{set: ..., paper: ..., authors: ..., why: ...} (where the setting comes from)")
            out.append(item)
        else:
            raise ParamsError(f"{where}: {item!r} is not a -S argument (a string 'key=value', '+key=value', '~key')")
    return out


def load_profiles(folder: str | Path = "profiles") -> dict[str, dict]:
    """``{"<paper>/<profile>": {"table", "set", "settings", "runs"}}`` of every profile
    file: ``set`` is the flat list of ``-S`` arguments, ``settings`` its annotated ones."""
    out = {}
    for path in sorted(Path(folder).glob("*.yaml")):
        body = yaml.safe_load(path.read_text()) or {}
        for name, profile in (body.get("profiles") or {}).items():
            missing = {"table", "set", "runs"} - set(profile)
            if missing:
                raise ParamsError(f"{path}: profile {name!r} lacks {sorted(missing)}")
            items = _flatten(profile["set"], f"{path}: {name}.set")
            out[f"{path.stem}/{name}"] = {
                **profile, "set": [i["set"] if isinstance(i, dict) else i for i in items],
                "settings": [i for i in items if isinstance(i, dict)]}
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def settings_tables(profiles: dict[str, dict]) -> str:
    """Markdown: per paper, every annotated setting of its profiles (paper | authors' code | ours, and why),
    with the profiles that carry it. docs/profiles.md holds this text (a test keeps them equal)."""
    papers: dict[str, dict[str, dict]] = {}
    for name, profile in profiles.items():
        paper, short = name.split("/")
        for item in profile["settings"]:
            row = papers.setdefault(paper, {}).setdefault(item["set"], {**item, "profiles": []})
            row["profiles"].append(short)
    lines: list[str] = []
    for paper, rows in papers.items():
        every = sorted(n.split("/")[1] for n in profiles if n.startswith(f"{paper}/"))
        lines += [f"**{paper}** (`profiles/{paper}.yaml`)", "",
                  "| `-S` setting (ours) | profiles | paper | authors' code | why |", "|---|---|---|---|---|"]
        for row in rows.values():
            where = "all" if sorted(row["profiles"]) == every else ", ".join(row["profiles"])
            lines.append(f"| `{_cell(row['set'])}` | {where} | {_cell(row['paper'])} | {_cell(row['authors'])} | "
                         f"{_cell(row['why'])} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


#: The GPU-hour estimate's assumptions (not measured: no GPU was lent): training images per second at batch 64,
#: 224 px, fp32/TF32 on one A100-class GPU (anchor: NVIDIA DeepLearningExamples' ResNet-50 v1.5 PyTorch, 938 img/s
#: TF32 at batch 256; BN-Inception has about half its FLOPs); evaluation 3x faster (forward only).
GPU_TRAIN_IMAGES_PER_S = {"bn_inception": 1400.0, "resnet50": 800.0}
#: JPEG decode + RandomResizedCrop + flip per loader process, measured here (scripts/bench_data_pipeline.py), and
#: the processes assumed (``runtime.loader_workers: -1`` on a 16-core machine: 15; 12 to leave room).
DECODE_IMAGES_PER_S, DECODE_PROCESSES = 231.0, 12
#: Per optimisation step: the method's own work, logging, the sampler (assumed).
STEP_OVERHEAD_S = 0.015
#: Training and evaluation images per dataset kind: the official counts; Food-101N's 144,086 (SGPS IV-A) and
#: CARS-98N's 9,558 listed images (fewer when links died) are the papers' figures, not checked by prepare.
PAPER_TRAIN_IMAGES = {"food101n": 144086, "cars98n": 9558}


def _images(params: dict, dataset: str) -> tuple[int, int]:
    from noisydml.data.benchmarks import BENCHMARKS

    kind = params["datasets"][dataset]["kind"]
    counts = BENCHMARKS[kind].official_counts(params["datasets"][dataset])
    train = counts.get("train_samples", PAPER_TRAIN_IMAGES.get(kind, 0))
    test = counts.get("test_samples", counts.get("query_samples", 0) + counts.get("gallery_samples", 0))
    return train, test


def estimate(params: dict) -> dict[str, float]:
    """The profile's iterations per run (the largest) and its GPU hours under the assumptions above: per run,
    iterations x batch at the GPU or decode rate (the slower), plus evaluations (every ``eval_every`` epochs and the
    last; one training-set pass; SGPS two more, BSPML one per epoch) at 3x, plus a fixed cost per step. SGPS with
    ``positive_source: forward`` trains on K more images per batch item from its first SGM epoch."""
    from noisydml.engine.sampling import steps_per_epoch
    from noisydml.runs import runs_of

    decode = DECODE_IMAGES_PER_S * DECODE_PROCESSES
    seconds, most = 0.0, 0
    for run in runs_of(params):
        run_params = run.params(params)
        train_cfg, method = run_params["train"], run_params["methods"][run.method]
        batch = train_cfg["batch"]["classes"] * train_cfg["batch"]["per_class"]
        train_images, test_images = _images(params, run.dataset)
        steps = steps_per_epoch(train_images, batch)
        iterations = train_cfg["epochs"] * steps
        trained = iterations * batch
        if method.get("positive_source") == "forward":
            forwarded_epochs = max(0, train_cfg["epochs"] - method["sgm"]["start_epoch"])
            trained += forwarded_epochs * steps * batch * method["positives_per_sample"]
        most = max(most, iterations)
        rate = min(GPU_TRAIN_IMAGES_PER_S[train_cfg["backbone"]], decode)
        evals = train_cfg["epochs"] // max(1, train_cfg["eval_every"]) + 1
        passes = 1 + (2 if run.method.startswith("sgps") else 0) + (train_cfg["epochs"] if run.method == "bspml" else 0)
        eval_rate = min(3 * GPU_TRAIN_IMAGES_PER_S[train_cfg["backbone"]], decode)
        seconds += (trained / rate + iterations * STEP_OVERHEAD_S
                    + (evals * test_images + passes * train_images) / eval_rate)
    return {"iterations": most, "gpu_hours": seconds / 3600}


def profiles_table(profiles: dict[str, dict], applied: dict[str, dict] | None = None) -> str:
    """Markdown: every profile, what it reproduces, its runs, iterations per run and estimated GPU hours
    (``applied``: each profile's params after its overrides, when the caller has them)."""
    applied = applied or {name: params_after(profile["set"]) for name, profile in profiles.items()}
    lines = ["| profile | reproduces | runs | iterations per run (largest) | estimated GPU hours |",
             "|---|---|---|---|---|"]
    total = 0.0
    for name, profile in profiles.items():
        est = estimate(applied[name])
        total += est["gpu_hours"]
        lines.append(f"| `{name}` | {profile['table']} | {profile['runs']} | {est['iterations']:,} | "
                     f"{est['gpu_hours']:.1f} |")
    lines.append(f"| all | | {sum(p['runs'] for p in profiles.values())} | | {total:.0f} |")
    return "\n".join(lines) + "\n"


SETTINGS_BEGIN = "<!-- profile settings: generated by scripts/paper_profile.py settings --write -->"
SETTINGS_END = "<!-- end of profile settings -->"


#: The page that prints the profile and settings tables.
PROFILES_PAGE = "docs/profiles.md"


def readme_with_settings(readme: str, tables: str) -> str:
    """``readme`` (the text of :data:`PROFILES_PAGE`) with the text between :data:`SETTINGS_BEGIN` and :data:`SETTINGS_END` replaced by ``tables``."""
    if SETTINGS_BEGIN not in readme or SETTINGS_END not in readme:
        raise ParamsError(f"{PROFILES_PAGE}: no {SETTINGS_BEGIN!r} ... {SETTINGS_END!r} block to write the tables into")
    head, rest = readme.split(SETTINGS_BEGIN, 1)
    return f"{head}{SETTINGS_BEGIN}\n\n{tables}\n{SETTINGS_END}{rest.split(SETTINGS_END, 1)[1]}"


def params_after(overrides: list[str], params: str | Path = "params.yaml") -> dict[str, Any]:
    """``params`` after ``dvc exp run -S`` applies ``overrides`` (DVC's own code, on a copy), read by the stages'
    loader and validated whole (:func:`noisydml.pipeline.check.check_all`)."""
    from dvc.exceptions import InvalidArgumentError
    from dvc.utils.hydra import apply_overrides

    from noisydml.config import load_params
    from noisydml.pipeline.check import check_all

    with tempfile.TemporaryDirectory() as folder:
        copy = Path(folder) / "params.yaml"
        shutil.copy(params, copy)
        try:
            apply_overrides(copy, overrides)
        except InvalidArgumentError as e:
            raise ParamsError(f"DVC refuses the overrides {overrides}: {e.__cause__ or e}") from None
        return check_all(load_params(copy))


def exp_command(name: str, profile: dict) -> str:
    """The ``dvc exp run`` command line of a profile."""
    flags = [f"-S {shlex.quote(item)}" for item in profile["set"]]
    exp_name = name.replace("/", "-").replace("_", "-")
    return " \\\n  ".join([f"dvc exp run -n {exp_name}", *flags])
