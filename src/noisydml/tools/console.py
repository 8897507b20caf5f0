"""``noisydml``: the product's one console command (``[project.scripts]`` in pyproject.toml).

    noisydml check [PARAMS]                 validate all of params.yaml at once
    noisydml launch [-j N] [--dry] ...      the stale stages at once on Ray (as `dvc repro` records them)
    noisydml profile list|check|plan|settings|lr|show|run|rehearse ...   the papers' tables as `dvc exp run` profiles
    noisydml verify --weights W --backbone B --dataset D   published face weights on the verification protocols
    noisydml ui [--port P]                  MLflow's UI on this repository's store
    noisydml guard                          CI's verdict on a regenerated pipeline
    noisydml status [DVC STATUS OPTIONS]    what `dvc repro` would run, the code digested first

Every subcommand has its own ``--help``. The stages' scripts (``python stages/<x>.py``) are DVC's to run, not a
user's; the scripts in ``scripts/`` are benchmarks and maintenance tools.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

#: Set when :func:`run_own_package` has re-started this command under the checkout's own package (no second time)
OWN_PACKAGE_STARTED = "NOISYDML_OWN_PACKAGE_STARTED"

COMMANDS = {
    "check": "validate all of params.yaml at once (every error, with its key, value and what is allowed)",
    "launch": "run the stale stages at once on Ray, recorded in dvc.lock as `dvc repro` records them",
    "profile": "the papers' tables as profiles of `dvc exp run -S` overrides: list, check, show, run, rehearse",
    "verify": "published face weights (arcface_torch's iResNet) evaluated as published on the verification sets",
    "ui": "MLflow's UI on this repository's store (mlflow.db and mlartifacts/, moved with the repository)",
    "guard": "CI's verdict: the pipeline regenerated, nothing stale, the committed results reproduced",
    "status": "the stages `dvc repro` would run: `dvc status` once the digest stages have run (seconds, no training)",
}


def foreign_package(root: Path) -> tuple[Path, Path] | None:
    """``(the checkout's package, the package this process imports)`` when ``root`` is a noisydml checkout
    (``src/noisydml``) and this process imports another copy of the package, else None.

    That happens in a clone that shares another checkout's virtual environment: its editable install points at
    the other checkout's ``src``. The stages would then run the other checkout's code while ``dvc.lock``
    records the hashes of this one's, and nothing would say so."""
    import noisydml

    own = root / "src" / "noisydml"
    if not (own / "__init__.py").is_file():
        return None
    running = Path(noisydml.__file__).resolve().parent
    return None if running == own.resolve() else (own.resolve(), running)


def run_own_package(argv: list[str], root: Path | None = None) -> None:
    """Re-start this command (``exec``: the same process) with the checkout's ``src`` first on ``PYTHONPATH``
    when it imports another checkout's package (:func:`foreign_package`); returns when there is nothing to do.
    The launcher's Ray workers inherit that ``PYTHONPATH``, so the stages they run import the checkout's code
    too. Raises when the re-started command still imports the other package."""
    if root is None:  # the checkout around the working directory, as DVC finds its repository
        root = next((d for d in (Path.cwd(), *Path.cwd().parents) if (d / "src" / "noisydml").is_dir()), Path.cwd())
    found = foreign_package(root)
    if found is None:
        return
    own, running = found
    if os.environ.get(OWN_PACKAGE_STARTED):
        raise SystemExit(f"noisydml: this checkout's package is {own}, but {running} is imported even with "
                         f"{own.parent} first on PYTHONPATH ({os.environ.get('PYTHONPATH')!r})")
    print(f"noisydml: running this checkout's package ({own}), not the environment's ({running})",
          file=sys.stderr, flush=True)
    path = os.pathsep.join([str(own.parent), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "PYTHONPATH": path, OWN_PACKAGE_STARTED: "1"}
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, "-c", "import sys; from noisydml.tools.console import main; "
                               "sys.exit(main())", *argv], env)


def main(argv: list[str] | None = None) -> int:
    if argv is None and sys.argv[1:2] and sys.argv[1] in COMMANDS:  # the console command, not a caller's main(argv)
        run_own_package(sys.argv[1:])
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="noisydml", description="noisydml: noise-robust deep metric learning, reproduced through DVC.",
        epilog="\n".join(f"  {name:<8} {text}" for name, text in COMMANDS.items())
        + "\n\n`noisydml COMMAND --help` for each; `dvc repro` runs the pipeline itself.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=list(COMMANDS), metavar="COMMAND", help=", ".join(COMMANDS))
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the command's own arguments")
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0 if argv else 2
    args = parser.parse_args(argv[:1])
    rest = argv[1:]
    if args.command == "check":
        check_parser().parse_args(rest)  # --help answered here, before the check's imports (seconds)
        from noisydml.tools.check import main as check

        return check(rest)
    if args.command == "launch":
        from noisydml.tools.launch import cli

        return cli(rest)
    if args.command == "guard":
        from noisydml.tools.guard import main as guard

        return guard(rest)
    if args.command == "profile":
        return profile(rest)
    if args.command == "verify":
        from noisydml.tools.verify_weights import main as verify

        return verify(rest)
    if args.command == "status":
        return status(rest)
    return ui(rest)


def run_digest_stages(root: Path = Path("."), env: dict | None = None) -> list[str]:
    """``dvc repro --single-item`` of the digest stages dvc.yaml has (code_digests, chain_code's items: they train
    nothing), so that ``dvc status`` compares what the code means now; returns their names."""
    from noisydml.pipeline.code_digests import is_digest_stage

    def dvc(*args: str) -> subprocess.CompletedProcess:
        proc = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=root, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"dvc {' '.join(args)} failed in {root}:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        return proc

    names = [n for n in dvc("stage", "list", "--name-only").stdout.split() if is_digest_stage(n)]
    if names:
        dvc("repro", "--single-item", *names)
    return names


def status(argv: list[str]) -> int:
    """``noisydml status``: the digest stages, then ``dvc status`` (its exit status); after a code edit or in a fresh
    clone (the code units are DVC outputs, not in git) plain ``dvc status`` compares code units that are stale or
    absent."""
    parser = argparse.ArgumentParser(prog="noisydml status", description=status.__doc__.split(":", 1)[1].strip())
    parser.epilog = "Any other option (e.g. --json, a stage name) is passed on to `dvc status`."
    _, dvc_args = parser.parse_known_args(argv)
    names = run_digest_stages()
    print(f"digest stages run: {', '.join(names) or 'none'}", file=sys.stderr)
    return subprocess.run([sys.executable, "-m", "dvc", "status", *dvc_args]).returncode


def check_parser() -> argparse.ArgumentParser:
    """``noisydml check``'s options (here, not in noisydml.tools.check: its help must not wait for its imports)."""
    parser = argparse.ArgumentParser(prog="noisydml check", description="Validate all of params.yaml at once: every "
                                     "problem of every section, each with its key, value and what is allowed.")
    parser.add_argument("params", nargs="?", default="params.yaml", help="the params file (default: params.yaml)")
    return parser


def profile(argv: list[str]) -> int:
    """``noisydml profile ...``: the paper profiles (noisydml.tools.profiles, docs/profiles.md)."""
    from noisydml.tools.profiles import load_profiles

    profiles = load_profiles()
    args = profile_parser(profiles, argv).parse_args(argv)
    return _profile_action(args, profiles)


def profile_parser(profiles: dict, argv: list[str] = ()) -> argparse.ArgumentParser:
    """``noisydml profile``'s options (``argv``: which help to prepare; the tests parse every documented one)."""
    parser = argparse.ArgumentParser(prog="noisydml profile", description=profile.__doc__.split(":", 1)[1].strip())
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    actions.add_parser("list", help="profiles, runs, iterations, estimated GPU hours")
    actions.add_parser("check", help="every profile applied through DVC's own override code, then validated")
    settings = actions.add_parser("settings", help="the settings tables of docs/profiles.md")
    settings.add_argument("--write", action="store_true", help="write them into docs/profiles.md")
    lr = actions.add_parser("lr", help="every profile's learning-rate curve")
    lr.add_argument("png", nargs="?", default="docs/profiles_lr.png", help="where (default: docs/profiles_lr.png)")
    plan = actions.add_parser("plan", help="hours, GPU memory, host memory and disk, each with its basis, against "
                                           "the node the profiles are sized for")
    plan.add_argument("profile", choices=list(profiles), metavar="PROFILE", help="one of `noisydml profile list`")
    for name, text in (("show", "print the profile's `dvc exp run` command"),
                       ("run", "run it: downloads, weights, training, the report (a GPU machine with internet)")):
        action = actions.add_parser(name, help=text)
        action.add_argument("profile", choices=list(profiles), metavar="PROFILE", help="one of `noisydml profile list`")
    from noisydml.tools.rehearsal import MINIATURE_KINDS

    # the rule, not the list: the list takes every profile applied through DVC (seconds), too slow for --help
    rehearse = actions.add_parser(
        "rehearse", help="its exact overrides through real `dvc exp run` on miniature data, on this machine's CPU",
        description="Rehearsable: a profile whose datasets have a miniature (kinds " + ", ".join(MINIATURE_KINDS)
                    + ") and whose noise is not the PRISM authors' published lists, which name the real datasets' "
                      "files; asked to rehearse another, it says why not and lists the rehearsable ones.")
    rehearse.add_argument("profile", metavar="PROFILE", help="a rehearsable profile (below)")
    rehearse.add_argument("folder", nargs="?", help="where (default: a new temporary folder, kept)")
    return parser


def _profile_action(args: argparse.Namespace, profiles: dict) -> int:
    from noisydml.tools.profiles import (PROFILES_PAGE, exp_command, lr_curves, params_after, profiles_table,
                                            readme_with_settings, settings_tables)

    if args.action == "list":  # with the GPU-hour estimate of noisydml.tools.profiles.estimate (its assumptions)
        print(profiles_table(profiles))
    elif args.action == "check":
        for name, p in profiles.items():  # through DVC's own override code, as `dvc exp run -S` applies them
            params_after(p["set"])
            print(f"{name}: valid")
    elif args.action == "settings":
        from noisydml.config import load_params
        from noisydml.tools.check import check_all
        from noisydml.tools.profiles import settings_page

        applied = {name: params_after(p["set"]) for name, p in profiles.items()}
        text = settings_page(profiles, applied, check_all(load_params("params.yaml")))
        if args.write:
            page = Path(PROFILES_PAGE)
            page.write_text(readme_with_settings(page.read_text(), text))
            print(f"{page}: profile and settings tables written")
        else:
            print(text)
    elif args.action == "plan":
        from noisydml.tools.plan import plan_text, profile_plan

        print(plan_text(profile_plan(args.profile, params_after(profiles[args.profile]["set"]))))
    elif args.action == "lr":
        applied = {name: params_after(p["set"]) for name, p in profiles.items()}
        print(f"{lr_curves(profiles, applied, args.png)}: written")
    elif args.action == "rehearse":
        from noisydml.tools.rehearsal import rehearse, why_not_rehearsable

        if args.profile not in profiles:
            return _refuse(f"profile {args.profile!r} does not exist; allowed: {', '.join(profiles)}")
        if (reason := why_not_rehearsable(profiles[args.profile])) is not None:
            allowed = [n for n, p in profiles.items() if why_not_rehearsable(p) is None]
            return _refuse(f"profile {args.profile!r} cannot be rehearsed: {reason}; rehearsable: {', '.join(allowed)}")
        folder = rehearse(args.profile, profiles[args.profile], folder=args.folder)
        print(f"{args.profile}: rehearsed in {folder} (report: {folder / 'reports' / 'results.md'})")
    else:  # show, run
        command = exp_command(args.profile, profiles[args.profile])
        print(command)
        if args.action == "run":
            return subprocess.call(command.replace("\\\n", " "), shell=True)
    return 0


def _refuse(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def ui(argv: list[str]) -> int:
    """``noisydml ui``: ``mlflow ui`` on the repository's store, its artifact locations moved to where the store
    now is (a copied or re-cloned repository; noisydml.tracking.relocate_artifacts)."""
    from noisydml.tracking import relocate_artifacts, sqlite_path, tracking_uri

    args = ui_parser().parse_args(argv)
    if args.workers < 1:
        return _refuse(f"--workers {args.workers}: the web server needs at least 1 process")
    uri = tracking_uri()
    db = sqlite_path(uri)
    if db is not None:
        if not db.is_file():
            return _refuse(f"no MLflow store at {db}: nothing has been trained in this repository yet (`dvc repro`)")
        moved = relocate_artifacts(db)
        if moved:
            print(f"{db}: artifact locations of {moved} experiment(s) and run(s) moved to {db.parent / 'mlartifacts'}")
    command = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", args.host,
               "--port", str(args.port), "--workers", str(args.workers)]
    print(" ".join(command), flush=True)
    from noisydml.processes import run_group

    # the server is a tree (MLflow's CLI, its web server and job consumers): stopped whole when this process is
    # interrupted, stopped by its PID or killed outright
    return run_group(command)


def ui_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="noisydml ui", description=ui.__doc__.split(":", 1)[1].strip())
    parser.add_argument("--port", type=int, default=5000, help="default: 5000")
    parser.add_argument("--host", default="127.0.0.1", help="default: 127.0.0.1 (this machine only)")
    parser.add_argument("--workers", type=int, default=1,
                        help="the web server's processes (default: 1, ours: one person viewing one repository's "
                             "store; MLflow's own default, 4, starts four, and the server is up ~12 s later on 2 cores)")
    return parser


if __name__ == "__main__":
    sys.exit(main())
