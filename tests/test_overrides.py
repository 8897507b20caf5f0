"""Every documented `dvc exp run -S` works as DVC applies it.

Each ``-S`` of the README, of params.yaml's comments and of the validator's hints (the paper profiles': tests/test_profiles.py) is
applied to a copy of params.yaml by DVC's own code (``dvc.utils.hydra.apply_overrides``, what ``dvc exp run -S``
calls: it merges dicts, needs ``+`` for a new key and writes ``3e-05``), then the file is read by the loader every
stage uses and validated. No emulation of DVC: a documented example that DVC refuses, or that leaves a file our
loader refuses, fails here.
"""

from __future__ import annotations

import re
import shlex
import shutil

import pytest
from dvc.utils.hydra import apply_overrides

from noisydml.config import load_params, read_params_file
from noisydml.tools.check import check_all, validate_all
from noisydml.schema import ParamsError

from conftest import REPO, with_readme_dataset


def exp_commands(text: str, comment: str | None = None) -> list[str]:
    """The ``dvc exp run`` commands written in ``text``: in code blocks, inline code or (``comment``) comment
    lines; a line ending in a backslash continues on the next."""
    lines = text.splitlines()
    if comment:
        lines = [line.split(comment, 1)[1] if comment in line else "" for line in lines]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    commands = []
    for line in joined.splitlines():
        for match in re.finditer(r"dvc exp run[^`\n]*", line):
            commands.append(match.group(0).split("  #")[0].strip())
    return commands


def inline_fragments(text: str) -> list[str]:
    """Inline code written as ``-S ...`` without the command (``-S '~chains' -S '+chains={}'``): each a set of
    overrides a reader applies as it stands. Placeholders (``<key>``, ``=N``) are for the reader to fill in."""
    out = []
    for span in re.findall(r"`([^`\n]*)`", text):
        if span.lstrip().startswith("-S ") and not re.search(r"<\w+>|=[A-Z]\b|\.\.\.", span):
            out.append(span.strip())
    return out


def set_params(command: str) -> list[str]:
    """The ``-S`` values of one command line."""
    words = shlex.split(command)
    return [words[i + 1] for i, word in enumerate(words[:-1]) if word in ("-S", "--set-param")]


def documented() -> dict[str, list[str]]:
    """Where -> the overrides of one documented command."""
    out = {}
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    for source, text, comment in ([(str(p.relative_to(REPO)), p.read_text(), None) for p in pages]
                                  + [("params.yaml", (REPO / "params.yaml").read_text(), "#")]):
        for i, command in enumerate(exp_commands(text, comment)):
            overrides = [o for o in set_params(command) if o != "..."]  # "dvc exp run -S ..." in prose
            if overrides:
                out[f"{source}#{i}"] = overrides
        for i, fragment in enumerate(inline_fragments(text) if comment is None else []):
            out[f"{source}#inline{i}"] = set_params(fragment)
    return out  # the profiles' commands: tests/test_profiles.py applies each through DVC


DOCUMENTED = documented()


def applied(tmp_path, overrides: list[str]) -> dict:
    """params.yaml after DVC applies ``overrides``, read and validated as every stage reads it."""
    path = tmp_path / "params.yaml"
    shutil.copy(REPO / "params.yaml", path)
    apply_overrides(path, with_readme_dataset(overrides))
    return validate_all(read_params_file(path))


def test_the_documentation_has_examples():
    assert len([k for k in DOCUMENTED if k.startswith("README")]) >= 6
    assert len([k for k in DOCUMENTED if "#inline" in k]) >= 4  # -S fragments without the command
    assert len([k for k in DOCUMENTED if k.startswith("params")]) >= 4


@pytest.mark.parametrize("where", sorted(DOCUMENTED))
def test_a_documented_override_is_valid_after_dvc_applies_it(where, tmp_path):
    applied(tmp_path, DOCUMENTED[where])


def test_a_small_learning_rate_is_a_float(tmp_path):
    """DVC writes ``3e-05`` (no dot), which YAML 1.1 (PyYAML) reads as a string; the loader reads YAML 1.2."""
    params = applied(tmp_path, ["train.optimizer.lr=3e-05"])
    assert params["train"]["optimizer"]["lr"] == pytest.approx(3e-05)
    assert "lr: 3e-05" in (tmp_path / "params.yaml").read_text()


def test_clearing_the_chains_as_the_hints_say(tmp_path):
    params = applied(tmp_path, ["~chains", "+chains={}", "~figures.bspml_maps", "+figures.bspml_maps={}",
                                "grid.methods=[ms,mcl]"])
    assert params["chains"] == {} and params["figures"]["bspml_maps"] == {}


def test_dropping_one_chain(tmp_path):
    params = applied(tmp_path, ["~chains.ms_on_prism_kept"])
    assert "ms_on_prism_kept" not in params["chains"] and "sgps_posterior" in params["chains"]


def test_the_validators_hints_are_overrides_that_work(tmp_path):
    """The hint of a refused chain is applied as it is written and then validates."""
    path = tmp_path / "params.yaml"
    shutil.copy(REPO / "params.yaml", path)
    apply_overrides(path, ["grid.methods=[ms,mcl,bspml]"])
    with pytest.raises(ParamsError) as refused:
        check_all(load_params(path))
    hint = re.search(r"-S ((?:'[^']*'\s*(?:-S\s*)?)+)", str(refused.value))
    assert hint, str(refused.value)
    apply_overrides(path, set_params("dvc exp run -S " + hint.group(1)))
    assert check_all(load_params(path))["chains"] == {}


def test_a_duplicated_key_is_refused_as_dvc_refuses_it(tmp_path):
    path = tmp_path / "params.yaml"
    text = (REPO / "params.yaml").read_text()
    path.write_text(text.replace("  sym50: {kind: symmetric, rate: 0.5, seed: 0}\n",
                                 "  sym50: {kind: symmetric, rate: 0.5, seed: 0}\n"
                                 "  sym50: {kind: symmetric, rate: 0.4, seed: 0}\n", 1))
    with pytest.raises(ParamsError, match=r"noise.*sym50.*twice|duplicate key \"sym50\""):
        read_params_file(path)


def test_a_new_key_needs_a_plus_as_dvc_says(tmp_path):
    from dvc.exceptions import InvalidArgumentError

    path = tmp_path / "params.yaml"
    shutil.copy(REPO / "params.yaml", path)
    with pytest.raises(InvalidArgumentError):
        apply_overrides(path, ["noise.sym70={kind: symmetric, rate: 0.7, seed: 0}"])
    apply_overrides(path, ["+noise.sym70={kind: symmetric, rate: 0.7, seed: 0}", "grid.noises=[clean,sym50,sc50,sym70]"])
    assert load_params(path)["noise"]["sym70"]["rate"] == 0.7
