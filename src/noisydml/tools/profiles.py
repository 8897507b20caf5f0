"""Paper profiles: the ``dvc exp run -S`` arguments that reproduce one paper table (``profiles/<paper>.yaml``).

A profile's ``set`` is the list of ``-S`` arguments exactly as DVC applies them (Hydra's override grammar: ``+`` adds
a key params.yaml lacks, ``~key`` removes one, a mapping value is merged into the mapping it replaces); lists
inside it (YAML anchors of shared settings) are flattened. With it: the table it reproduces, its number of runs and
the GPU hours per run the estimate is made from. ``noisydml profile`` lists them, checks them
through DVC's own override code and prints (or runs) the command. No stage imports this module.
"""

from __future__ import annotations

import json
import shlex
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from noisydml.schema import ParamsError
from noisydml.tracking import flatten


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


def _field_help(method: str, key: str) -> str:
    """The help text of ``methods.<method>.<key>``'s field (its source: paper, authors or ours), or ''."""
    from noisydml.methods import load_spec

    spec = load_spec(method)
    parts = key.split(".")
    if len(parts) == 1:
        field = spec.schema.get(parts[0])
    else:
        field = (spec.nested or {}).get(parts[0], {}).get(parts[1])
    return getattr(field, "help", "") or ""


def inherited_tables(profiles: dict[str, dict], applied: dict[str, dict], base: dict) -> str:
    """Markdown: per paper, every method setting its profiles' runs take from params.yaml unchanged (no ``-S``
    sets it), with the field's own words on where the value comes from: the settings tables' complement, so that
    every value a profile trains with is written down."""
    from noisydml.runs import runs_of

    papers: dict[str, dict[tuple[str, str], list[str]]] = {}
    for name in profiles:
        paper, short = name.split("/")
        params = applied[name]
        for method in sorted({run.method for run in runs_of(params)}):
            mine = flatten(params["methods"][method], f"{method}.")
            theirs = flatten(base["methods"].get(method, {}), f"{method}.")
            for key, value in mine.items():
                if key in theirs and theirs[key] == value and not key.split(".")[1] == "per_noise":
                    papers.setdefault(paper, {}).setdefault((key, json.dumps(value)), []).append(short)
    lines = []
    for paper, rows in papers.items():
        every = sorted(n.split("/")[1] for n in profiles if n.startswith(f"{paper}/"))
        lines += [f"<details><summary><b>{paper}</b>: {len(rows)} method settings inherited from params.yaml "
                  "</summary>", "", "| setting (params.yaml) | profiles | where the value comes from (the field's help) |",
                  "|---|---|---|"]
        for (key, value), names in sorted(rows.items()):
            method, leaf = key.split(".", 1)
            where = "all" if sorted(set(names)) == every else ", ".join(sorted(set(names)))
            lines.append(f"| `methods.{key}: {_cell(value)}` | {where} | {_cell(_field_help(method, leaf)) or '-'} |")
        lines += ["", "</details>", ""]
    return "\n".join(lines).rstrip() + "\n"


#: The GPU-hour estimate's rates, measured once (docs/gpu.md "Figures": scripts/gpu_check.py on one H100, torch
#: 2.11): training images per second, forward + backward at batch 64, 224 px, float32 (cuDNN's TF32 convolutions),
#: channels-last off, as the profiles train; evaluation assumed 3x faster (forward only).
GPU_TRAIN_IMAGES_PER_S = {"bn_inception": 1453.0, "resnet50": 1677.0,
                          # at 112 px, scaled from resnet50's measured rate by forward FLOPs (iResNet-50 6.3G,
                          # ResNet-50 4.1G at 224 px): not measured
                          "iresnet18": 2620.0, "iresnet34": 1510.0, "iresnet50": 1090.0, "iresnet100": 566.0}
#: JPEG decode + RandomResizedCrop + flip on the same 16-core machine, the pipeline's loader at its best worker
#: count (8 of 0..15 measured; 15 gave 567): the whole machine's rate, the bound for file-stored benchmarks.
DECODE_IMAGES_PER_S = 772.0
#: Methods that train a second network beside the model (forward and backward on every batch, the images decoded
#: once): Co-teaching and its variants, DivideMix, UNICON.
TWO_NETWORKS = ("coteaching", "coteaching_plus", "coteaching_t", "dividemix", "unicon")
#: Per optimisation step: the method's own work, logging, the sampler (assumed).
STEP_OVERHEAD_S = 0.015
#: Training and evaluation images per dataset kind: the official counts; Food-101N's 144,086 (SGPS IV-A) and
#: CARS-98N's 9,558 listed images (fewer when links died) are the papers' figures, not checked by prepare.
PAPER_TRAIN_IMAGES = {"food101n": 144086, "cars98n": 9558}


#: Face recognition (SGPS Table IV), source local: training images by ``variant`` (the paper's MS1MV0 10M, MS1MV2
#: 5.8M) and the evaluation crops: LFW 12,000 + CFP-FP 14,000 + AgeDB-30 12,000 (each pair's two images) + IJB-C's
#: 469,375 (insightface's ``ijbc_name_5pts_score.txt``, as we recall it: check before relying on it).
FACE_TRAIN_IMAGES = {"noisy": 10_000_000, "cleaned": 5_800_000}
FACE_TEST_IMAGES = 12_000 + 14_000 + 12_000 + 469_375
#: 112-px crops from RecordIO decode far faster than full-size JPEGs: 2,000 images/s per loader process on 12
#: processes (assumed; not measured).
FACE_DECODE_IMAGES_PER_S = 2000.0 * 12
#: Methods that forward the batch a second time through a momentum key encoder (no backward): ~1/3 more compute.
KEY_ENCODER = ("dcq", "dcq_sgps")


def _images(params: dict, dataset: str) -> tuple[int, int]:
    from noisydml.data.benchmarks import BENCHMARKS

    kind = params["datasets"][dataset]["kind"]
    if kind == "faces":
        cfg = params["datasets"][dataset]
        return FACE_TRAIN_IMAGES[cfg["variant"]], FACE_TEST_IMAGES
    counts = BENCHMARKS[kind].official_counts(params["datasets"][dataset])
    train = counts.get("train_samples", PAPER_TRAIN_IMAGES.get(kind, 0))
    test = counts.get("test_samples", counts.get("query_samples", 0) + counts.get("gallery_samples", 0))
    return train, test


def estimate(params: dict) -> dict[str, float]:
    """The profile's iterations per run (the largest) and its GPU hours at the rates above: per run,
    iterations x batch at the GPU or decode rate (the slower), plus evaluations (every ``eval_every`` epochs and the
    last, and every ``test_check_every_steps`` steps; one training-set pass; SGPS two more, BSPML one per epoch) at 3x, plus a fixed cost per step. SGPS with
    ``positive_source: forward`` trains on K more images per batch item from its first SGM epoch; a method with a
    second network (:data:`TWO_NETWORKS`) trains at half the GPU rate."""
    from noisydml.engine.sampling import steps_per_epoch
    from noisydml.runs import runs_of

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
        networks = 2 if run.method in TWO_NETWORKS else (4 / 3 if run.method in KEY_ENCODER else 1)
        face = params["datasets"][run.dataset]["kind"] == "faces"
        decode = FACE_DECODE_IMAGES_PER_S if face else DECODE_IMAGES_PER_S
        rate = min(GPU_TRAIN_IMAGES_PER_S[train_cfg["backbone"]] / networks, decode)
        evals = train_cfg["epochs"] // max(1, train_cfg["eval_every"]) + 1
        if train_cfg["test_check_every_steps"]:  # a test pass every N steps (the test-selected figure)
            evals += iterations // train_cfg["test_check_every_steps"]
        passes = 1 + (2 if "sgps" in run.method else 0) + (train_cfg["epochs"] if run.method == "bspml" else 0)
        eval_rate = min(3 * GPU_TRAIN_IMAGES_PER_S[train_cfg["backbone"]], decode)
        seconds += (trained / rate + iterations * STEP_OVERHEAD_S
                    + (evals * test_images + passes * train_images) / eval_rate)
    return {"iterations": most, "gpu_hours": seconds / 3600}


def lr_curves(profiles: dict[str, dict], applied: dict[str, dict], path: str | Path) -> Path:
    """Draw every profile's learning-rate factor over its run (the largest dataset's steps, the full datasets'
    sizes), one line per distinct curve, into ``path`` (a PNG): the SGPS retrieval profiles' fitted
    warm-up/hold/cosine beside the authors' closed form at the same length, the face profiles' steps, and the PRISM
    and BSPML profiles' schedules."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from noisydml.engine.optim import lr_factor
    from noisydml.engine.sampling import steps_per_epoch

    curves: dict[tuple, list[str]] = {}
    for name in profiles:
        params = applied[name]
        train = params["train"]
        batch = train["batch"]["classes"] * train["batch"]["per_class"]
        for dataset in params["grid"]["datasets"]:
            steps = steps_per_epoch(_images(params, dataset)[0], batch)
            key = (json.dumps(train["schedule"], sort_keys=True), train["epochs"], steps)
            curves.setdefault(key, []).append(f"{name} ({dataset})")
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.5), sharey=True)
    colours = iter(plt.get_cmap("tab20").colors)
    for (schedule, epochs, steps), names in curves.items():
        schedule = json.loads(schedule)
        total = epochs * steps
        ax = axes[1] if names[0].startswith("sgps/table4") else axes[0] if names[0].startswith("sgps/") else axes[2]
        x = np.linspace(0, total - 1, 400).astype(int)
        factor = lr_factor(schedule, epochs, steps)
        label = ", ".join(names[:2]) + (f" +{len(names) - 2}" if len(names) > 2 else "")
        colour = next(colours)
        ax.plot(x, [factor(int(t)) for t in x], color=colour, label=f"{label}: {total:,} steps")
        if schedule["name"] == "warmup_hold_cosine_fitted":  # the authors' closed form at the same length
            authors = lr_factor({**schedule, "name": "warmup_hold_cosine"}, epochs, steps)
            ax.plot(x, [authors(int(t)) for t in x], ls=":", color=colour)
    axes[0].set_title("SGPS: fitted to the run (dotted: the authors' closed form, periodic)", fontsize=9)
    axes[1].set_title("SGPS Table IV (faces): x 0.1 at epochs 4, 8 and 9", fontsize=9)
    axes[2].set_title("PRISM and BSPML: cosine to 0 over the run", fontsize=9)
    axes[0].set_ylabel("lr / peak lr")
    for ax in axes:
        ax.set_xlabel("optimisation step")
        ax.legend(fontsize=6, loc="upper right")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


#: The PRISM selection's kept shares at each profile's scale (``scripts/bench_prism_scale.py --profiles``), in the
#: repository this module belongs to.
KEPT_SHARES = Path(__file__).resolve().parents[3] / "references" / "prism_selection_scale.json"


def kept_shares(params: dict, path: str | Path = KEPT_SHARES) -> list[dict] | None:
    """The simulated kept shares of the profile's PRISM selections (both rules), or None when the profile has none;
    a setting the file lacks is refused, naming the command that measures it."""
    from noisydml.tools.plan import selection_settings

    wanted = selection_settings(params)
    if not wanted:
        return None
    known = json.loads(Path(path).read_text())["settings"] if Path(path).is_file() else []
    out = []
    for setting in wanted:
        match = [k for k in known if all(k[key] == value for key, value in setting.items())]
        if not match:
            raise ParamsError(f"{Path(path).name}: no simulated kept share for the PRISM selection {setting}; measure it: "
                              "python scripts/bench_prism_scale.py --profiles")
        out.append(match[0])
    return out


def _kept_cell(shares: list[dict] | None) -> str:
    if shares is None:
        return "-"
    cells = sorted({f"{s['authors']['kept_share_of_scorable']:.1%} / {s['ours']['kept_share_of_scorable']:.1%}"
                    f" ({s['classes']:,} classes, M {s['memory_size']:,}, R {s['noise_rate']:g})" for s in shares})
    return "; ".join(cells)


def profiles_table(profiles: dict[str, dict], applied: dict[str, dict] | None = None) -> str:
    """Markdown: every profile, what it reproduces, its runs, iterations per run, estimated GPU hours, what it needs
    of the node (:mod:`noisydml.tools.plan`) and PRISM's kept share at its scale (``applied``: each profile's
    params after its overrides, when the caller has them)."""
    from noisydml.tools.plan import MACHINE, profile_plan, summary_row

    applied = applied or {name: params_after(profile["set"]) for name, profile in profiles.items()}
    lines = ["| profile | reproduces | runs | iterations per run (largest) | estimated GPU hours | GPU memory per "
             "process, largest run (GiB) | host memory, runs at once (GiB) | disk (GB) | fits the node | PRISM's "
             "selection keeps, of scorable samples: authors' rule / ours |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    total = 0.0
    for name, profile in profiles.items():
        est = estimate(applied[name])
        total += est["gpu_hours"]
        row = summary_row(profile_plan(name, applied[name]))
        fits = "yes" if row["fits"] else "**no**: " + "; ".join(row["misfits"])
        lines.append(f"| `{name}` | {profile['table']} | {profile['runs']} | {est['iterations']:,} | "
                     f"{est['gpu_hours']:.1f} | {row['gpu_gib']:,.1f} | {row['host_gib']:,.0f} | "
                     f"{row['disk_gb']:,.0f} | {fits} | {_kept_cell(kept_shares(applied[name]))} |")
    lines.append(f"| all | | {sum(p['runs'] for p in profiles.values())} | | {total:.0f} | | | | | |")
    lines += ["", f"The node: {MACHINE.title} (`noisydml profile plan <profile>`: every figure with its basis). "
              "PRISM's kept share: simulated at the profile's classes, memory, R and P x K with 50 % symmetric "
              "noise (`scripts/bench_prism_scale.py --profiles`); the authors' rule ranks unscorable samples "
              "(no class centre in the memory) with the rest at P_clean = 1."]
    return "\n".join(lines) + "\n"


def settings_page(profiles: dict[str, dict], applied: dict[str, dict], base: dict) -> str:
    """The generated block of :data:`PROFILES_PAGE`: the profiles table, the settings each profile sets, and the
    method settings they inherit (``base``: params.yaml validated)."""
    return (profiles_table(profiles, applied) + "\n" + settings_tables(profiles)
            + "\nSettings the profiles inherit from params.yaml unchanged (the defaults; a field's help says whose "
              "value it is, and `(ours)` marks our choice):\n\n" + inherited_tables(profiles, applied, base))


SETTINGS_BEGIN = "<!-- profile settings: generated by noisydml profile settings --write -->"
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
    loader and validated whole (:func:`noisydml.tools.check.check_all`)."""
    from noisydml.config import load_params
    from noisydml.tools.check import check_all
    from noisydml.tools.overrides import dvc_apply

    with tempfile.TemporaryDirectory() as folder:
        copy = Path(folder) / "params.yaml"
        shutil.copy(params, copy)
        dvc_apply(copy, overrides)  # DVC's refusal as a ParamsError naming the overrides
        return check_all(load_params(copy))


def exp_command(name: str, profile: dict) -> str:
    """The ``dvc exp run`` command line of a profile."""
    flags = [f"-S {shlex.quote(item)}" for item in profile["set"]]
    exp_name = name.replace("/", "-").replace("_", "-")
    return " \\\n  ".join([f"dvc exp run -n {exp_name}", *flags])
