"""What a stage would refuse later is refused by `python -m noisydml.pipeline.check` first, naming the file once,
the key, the value and what is allowed; every helper script answers --help."""

import subprocess
import sys
from pathlib import Path

import pytest
from ruamel.yaml import YAML

REPO = Path(__file__).resolve().parents[1]


def _set(*keys, value):
    def edit(params):
        section = params
        for key in keys[:-1]:
            section = section[key]
        section[keys[-1]] = value
    return edit


CASES = {
    # a published list's checksum that is not one: found before a 2.4 GB download, not at corrupt@cub
    "sha256": (_set("noise", "prism_sym10", "lists", "cub", "noisy_list", "sha256", value="abc123"),
               ["noise.prism_sym10.lists.cub.noisy_list.sha256", "'abc123'", "64 hex digits"]),
    # more source characters than the fonts give: found before the pretrain stage renders them
    "pretrain_classes": (_set("pretrain", "classes", value=5000), ["pretrain.classes", "5000", "567"]),
    # zero runs, and not blamed on a chain or a figure
    "empty_seeds": (_set("grid", "seeds", value=[]), ["grid.seeds", "[]", "non-empty list of seeds"]),
    # a batch torchrun's ranks cannot split: found before torchrun starts
    "processes": (_set("runtime", "processes", value=3), ["runtime.processes", "3", "64 rows", "[1, 2, 4, 8, 16]"]),
}


def _check(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "noisydml.pipeline.check", str(path)], capture_output=True,
                          text=True, cwd=REPO)


@pytest.mark.parametrize("case", sorted(CASES))
def test_check_refuses_with_key_value_and_allowed(case, tmp_path):
    edit, expected = CASES[case]
    yaml = YAML()
    params = yaml.load((REPO / "params.yaml").read_text())
    edit(params)
    path = tmp_path / "params.yaml"
    with path.open("w") as f:
        yaml.dump(params, f)
    result = _check(path)
    assert result.returncode == 2, result.stdout + result.stderr
    message = result.stderr.strip()
    for part in expected:
        assert part in message, message
    assert message.count(str(path)) == 1 and "chains" not in message and "figures" not in message


def test_a_key_written_twice_is_refused_naming_the_file_once(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text((REPO / "params.yaml").read_text().replace("  seeds: [0]\n", "  seeds: [0]\n  seeds: [1]\n", 1))
    result = _check(path)
    assert result.returncode == 2 and "written twice" in result.stderr and '"seeds"' in result.stderr
    assert result.stderr.count(str(path)) == 1


def test_check_help_is_help_not_a_file_name():
    result = subprocess.run([sys.executable, "-m", "noisydml.pipeline.check", "--help"], capture_output=True,
                            text=True, cwd=REPO)
    assert result.returncode == 0 and "usage:" in result.stdout and "no such file" not in result.stderr


def test_the_pretrain_bound_is_the_fonts_count():
    from noisydml.config import PRETRAIN_SOURCE_CLASSES
    from noisydml.data.glyphs import source_chars

    assert len(source_chars()) == PRETRAIN_SOURCE_CLASSES["glyphs"]


@pytest.mark.parametrize("script", sorted(p.name for p in (REPO / "scripts").glob("*.py")))
def test_every_script_answers_help(script):
    result = subprocess.run([sys.executable, f"scripts/{script}", "--help"], capture_output=True, text=True,
                            cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and result.stdout.strip()


def test_a_mistyped_profile_is_named_with_the_allowed_ones():
    result = subprocess.run([sys.executable, "scripts/paper_profile.py", "show", "prism/no_such"], capture_output=True,
                            text=True, cwd=REPO)
    assert result.returncode == 2 and "'prism/no_such'" in result.stderr and "prism/table1_cub" in result.stderr
    assert "Traceback" not in result.stderr
