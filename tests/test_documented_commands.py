"""Every command in a fenced shell block of the README and docs/ runs as written, or is validated by the tool
that would run it: our own commands by their own parsers (the cheap ones run), `dvc` by DVC's parser (`dvc exp
run -S` through DVC's apply_overrides and our validation: tests/test_overrides.py), `ray` and `mlflow` by their
click commands, pytest's markers by pyproject.toml, paths by the file system. A command no rule knows fails here:
a new kind of command needs its check.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import README_OWN_DATASET, REPO, SHELL_LANGUAGES, fenced_commands, with_readme_dataset

#: Shell words of the Slurm script in docs/launch.md and the install lines: the shell's, not a program to check.
SHELL_WORDS = ("set", "cd", "sleep", "for", "done", "export", ".", "source", "python3.11")


COMMANDS = fenced_commands()


#: Example values of the shell variables the documented commands use (Slurm's, the script's own).
EXAMPLE_VARIABLES = {"SLURM_CPUS_PER_TASK": "32", "head_ip": "10.0.0.1", "PWD": str(REPO),
                     "SLURM_SUBMIT_DIR": str(REPO)}


def _words(command: str) -> list[str]:
    # placeholders a reader fills in: [FOLDER]; shell variables: example values
    command = re.sub(r"\$\{?(\w+)\}?", lambda m: EXAMPLE_VARIABLES.get(m.group(1), m.group(0)), command)
    return [w for w in shlex.split(command) if not re.fullmatch(r"\[[A-Z_]+\]", w)]


def _noisydml(words: list[str]) -> None:
    from noisydml.tools.console import COMMANDS as SUBCOMMANDS, profile_parser, ui_parser
    from noisydml.tools.launch import build_parser
    from noisydml.tools.profiles import load_profiles
    from noisydml.tools.rehearsal import why_not_rehearsable

    command, rest = words[1], words[2:]
    assert command in SUBCOMMANDS, command
    if command == "launch":
        args = build_parser().parse_args(rest)
        if args.set_param:
            _validate_overrides(args.set_param)
    elif command == "profile":
        profiles = load_profiles()
        args = profile_parser(profiles).parse_args(rest)
        if args.action == "rehearse":
            assert args.profile in profiles and why_not_rehearsable(profiles[args.profile]) is None, args.profile
        if args.action in ("list", "show"):  # cheap: run them (in this process)
            assert _console(words[1:]) == 0
    elif command == "ui":
        ui_parser().parse_args(rest)
    else:  # check, guard: their --help (check runs on the repository's params in tests/test_refusals.py)
        with pytest.raises(SystemExit) as done:
            _console([command, *rest, "--help"])
        assert done.value.code == 0


def _console(argv: list[str]) -> int:
    """``noisydml argv`` in this process, from the repository root, its output kept from the test's."""
    import contextlib
    import io

    from noisydml.tools.console import main

    with contextlib.chdir(REPO), contextlib.redirect_stdout(io.StringIO()):
        return main(argv)


def _validate_overrides(overrides: list[str]) -> None:
    import shutil
    import tempfile

    from dvc.utils.hydra import apply_overrides

    from noisydml.config import read_params_file
    from noisydml.tools.check import validate_all

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "params.yaml"
        shutil.copy(REPO / "params.yaml", path)
        apply_overrides(path, with_readme_dataset(overrides))
        validate_all(read_params_file(path))


def _dvc(words: list[str]) -> None:
    from dvc.cli import parse_args

    args = parse_args(words[1:])
    if words[1:3] == ["exp", "run"] and args.set_param:
        _validate_overrides(args.set_param)


def _click(cli, words: list[str]) -> None:
    """Parse ``words`` (program first) with a click group, as its console script would, without running it."""
    context = cli.make_context(words[0], list(words[1:]), resilient_parsing=False)
    name, command, rest = cli.resolve_command(context, context.protected_args + context.args)
    command.make_context(name, rest, parent=context)


def _pytest(words: list[str]) -> None:
    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    markers = {m.split(":")[0] for m in config["markers"]}
    assert words[1:3] == ["-m", "pytest"], words
    for i, word in enumerate(words):
        if word == "-m" and i > 1:
            assert set(re.findall(r"\w+", words[i + 1])) - {"not", "and", "or"} <= markers, words[i + 1]
        if word.startswith("-") and word not in ("-q", "-m", "-k", "--dist", "-n", "-x"):
            pytest.fail(f"an option this test does not know: {word}")


def _python(words: list[str]) -> None:
    if words[1:2] == ["-m"] and words[2] == "pytest":
        return _pytest(words)
    if words[1:3] == ["-m", "venv"]:
        return None
    script = REPO / words[1]
    assert script.is_file(), words[1]
    if words[1] == "scripts/method_ablations.py" and words[2] in READ_ONLY_ABLATIONS:
        return _run_ok([sys.executable, *words[1:]])  # reads committed results: run as written
    _run_ok([sys.executable, words[1], "--help"])


#: ``scripts/method_ablations.py`` subcommands that only read results (and write a figure where told): run.
READ_ONLY_ABLATIONS = ("table", "summary", "weights", "figure")


def _pip(words: list[str]) -> None:
    import tomllib

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for i, word in enumerate(words):
        if word in ("-r", "-c"):
            assert (REPO / words[i + 1]).is_file(), words[i + 1]
        for extra in re.findall(r"^\.\[(.*)\]$", word):
            assert set(extra.split(",")) <= set(extras), word


def _run_ok(argv: list[str]) -> None:
    result = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]


def _check(command: str) -> None:
    if re.match(r"^\w+=", command) or command.split()[0] in SHELL_WORDS:
        if command.split()[0] == ".":
            assert command.split()[1] in (".venv/bin/activate",), command
        return
    words = _words(command)
    program = words[0]
    if program == "noisydml":
        _noisydml(words)
    elif program == "dvc":
        _dvc(words)
    elif program in ("python", "python3"):
        _python(words)
    elif program == "pip":
        _pip(words)
    elif program == "ray":
        from ray.scripts.scripts import cli

        _click(cli, words)
    elif program == "mlflow":
        from mlflow.cli import cli

        _click(cli, words)
    else:
        pytest.fail(f"no check for the program {program!r}: add one to tests/test_documented_commands.py")


def test_the_documentation_has_its_commands():
    pages = {key.split(":")[0] for key in COMMANDS}
    assert "README.md" in pages and "docs/launch.md" in pages and "docs/profiles.md" in pages
    assert any(c.startswith("noisydml ui") for c in COMMANDS.values())


@pytest.mark.parametrize("where", sorted(COMMANDS))
def test_a_documented_command_runs_or_is_valid(where):
    _check(COMMANDS[where])


def test_every_shell_block_is_valid_shell():
    for page in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        for block in re.finditer(r"```(\w*)\n(.*?)```", page.read_text(), re.S):
            if block.group(1) in SHELL_LANGUAGES:
                result = subprocess.run(["bash", "-n"], input=block.group(2), capture_output=True, text=True)
                assert result.returncode == 0, (page, block.group(2)[:300], result.stderr)


def test_a_broken_command_is_caught():
    """The checks are not vacuous: a misspelt option, profile, subcommand and marker each fail."""
    for command in ("noisydml launch --jobz 2", "noisydml profile show prism/no_such",
                    "noisydml profile rehearse prism/table1_cub", "dvc exp run -S noise.sym50.rate=50",
                    "dvc metrics difff", "python -m pytest -m rehersal", "ray start --headd", "nosuchtool x"):
        with pytest.raises((SystemExit, AssertionError, Exception, pytest.fail.Exception)):
            _check(command)


def test_noisydml_and_every_subcommand_answer_help(capsys, monkeypatch):
    """The console script's own process once (`noisydml --help`), then every subcommand's --help in this one."""
    from noisydml.tools.console import COMMANDS as SUBCOMMANDS, main

    result = subprocess.run([str(Path(sys.executable).parent / "noisydml"), "--help"], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and all(name in result.stdout for name in SUBCOMMANDS), result.stdout
    monkeypatch.chdir(REPO)
    for argv in [[name] for name in SUBCOMMANDS] + [["profile", action] for action in
                                                     ("list", "check", "settings", "lr", "show", "run", "rehearse")]:
        with pytest.raises(SystemExit) as done:
            main([*argv, "--help"])
        out = capsys.readouterr().out
        assert done.value.code == 0 and "usage: noisydml" in out, (argv, out[-1500:])


def test_the_console_script_is_installed_as_declared():
    import tomllib

    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"noisydml": "noisydml.tools.console:main"}
    installed = Path(sys.executable).parent / "noisydml"
    assert installed.is_file(), "pip install -e . puts the noisydml command beside python"


def test_the_own_dataset_the_overrides_assume_is_the_readmes():
    """conftest's :data:`README_OWN_DATASET` is the README's example, not one of the tests' own."""
    assert "mine={kind: folder, root: /path/to/images, image_size: 64, channels: 3}" in README_OWN_DATASET[0]
    assert "  mine: {kind: folder, root: /path/to/images, image_size: 64, channels: 3}" in (REPO / "README.md").read_text()


def test_every_help_answers_before_the_heavy_imports():
    """``--help`` of every subcommand loads no torch, DVC's repository, MLflow, Ray or pandas (they take seconds to import): answered
    from the parsers alone (the figures, under 0.4 s each on a 2-core AMD EPYC, are in the issue's note)."""
    from noisydml.tools.console import COMMANDS as SUBCOMMANDS

    argvs = [[name] for name in SUBCOMMANDS] + [["profile", action] for action in
                                                 ("list", "check", "settings", "lr", "show", "run", "rehearse", "plan")]
    code = ("import sys, contextlib, io\nfrom noisydml.tools.console import main\n"
            f"for argv in {argvs!r}:\n"
            "    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
            "        main([*argv, '--help'])\n"
            "print(sorted(m for m in ('torch', 'dvc.repo', 'mlflow', 'ray', 'pandas') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", result.stdout
