"""What a stage would refuse later is refused by `python -m noisydml.tools.check` first, naming the file once,
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
    return subprocess.run([sys.executable, "-m", "noisydml.tools.check", str(path)], capture_output=True,
                          text=True, cwd=REPO)


@pytest.mark.parametrize("case", sorted(CASES))
def test_check_refuses_with_key_value_and_allowed(case, tmp_path):
    edit, expected = CASES[case]
    path = _edited(tmp_path, edit)
    result = _check(path)
    assert result.returncode == 2, result.stdout + result.stderr
    message = result.stderr.strip()
    for part in expected:
        assert part in message, message
    assert message.count(str(path)) == 1 and "chains" not in message and "figures" not in message


def _rename(*keys, new):
    def edit(params):
        section = params
        for key in keys[:-1]:
            section = section[key]
        section[new] = section.pop(keys[-1])
    return edit


def _folder_dataset(params):
    params["datasets"]["mine"] = {"kind": "folder", "root": "/no/such/folder", "image_size": 64, "channels": 3}
    params["grid"]["datasets"] = ["glyphs", "mine"]


#: The mistakes a new user made (issue 52's list), each with what its message must name.
MISTAKES = {
    **CASES,
    "typo_in_a_method_key": (_rename("methods", "ms", "loss", "alpha", new="alhpa"),
                             ["methods.ms.loss", "'alhpa'", "did you mean 'alpha'"]),
    "near_miss_method": (lambda p: p["grid"]["methods"].append("prims"), ["'prims'", "did you mean 'prism'"]),
    "unknown_key": (_set("evaluate", "max_kk", value=3), ["evaluate", "'max_kk'", "did you mean 'max_k'"]),
    "lr_zero": (_set("train", "optimizer", "lr", value=0.0), ["train.optimizer.lr", "above 0"]),
    "rate_as_percent": (_set("noise", "sym50", "rate", value=50), ["noise.sym50.rate", "fractions"]),
    "rate_as_percent_text": (_set("noise", "sc50", "rate", value="50%"), ["noise.sc50.rate", "fractions"]),
    "folder_root_missing": (_folder_dataset, ["datasets.mine.root", "/no/such/folder", "does not exist"]),
}


@pytest.mark.parametrize("case", sorted(set(MISTAKES) - set(CASES)))
def test_each_mistake_alone_is_refused_naming_its_key(case, tmp_path):
    """In this process (the command line's wording is the all-at-once test's, below)."""
    from noisydml.config import read_params_file
    from noisydml.tools.check import validate_all
    from noisydml.schema import ParamsError

    edit, expected = MISTAKES[case]
    path = _edited(tmp_path, edit)
    with pytest.raises(ParamsError) as refused:
        validate_all(read_params_file(path), files=path.parent)
    for part in expected:
        assert part in str(refused.value), str(refused.value)


def test_every_mistake_at_once_is_reported_at_once_each_naming_its_key(tmp_path):
    """All the mistakes in one file: one run of `check` lists every one (the README says it validates everything
    at once), each naming its key, the file named once."""
    def edit(params):
        for mistake, _ in MISTAKES.values():
            mistake(params)

    path = _edited(tmp_path, edit)
    result = _check(path)
    assert result.returncode == 2, result.stdout + result.stderr
    message = result.stderr
    missing = {case: [part for part in expected if part not in message] for case, (_, expected) in MISTAKES.items()}
    assert not {k: v for k, v in missing.items() if v}, message
    assert message.count(str(path)) == 1 and "problems:" in message


def _edited(tmp_path, edit) -> Path:
    yaml = YAML()
    params = yaml.load((REPO / "params.yaml").read_text())
    edit(params)
    path = tmp_path / "params.yaml"
    with path.open("w") as f:
        yaml.dump(params, f)
    return path


def test_a_key_written_twice_is_refused_naming_the_file_once(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text((REPO / "params.yaml").read_text().replace("  seeds: [0]\n", "  seeds: [0]\n  seeds: [1]\n", 1))
    result = _check(path)
    assert result.returncode == 2 and "written twice" in result.stderr and '"seeds"' in result.stderr
    assert result.stderr.count(str(path)) == 1


def test_check_help_is_help_not_a_file_name():
    result = subprocess.run([sys.executable, "-m", "noisydml.tools.check", "--help"], capture_output=True,
                            text=True, cwd=REPO)
    assert result.returncode == 0 and "usage:" in result.stdout and "no such file" not in result.stderr


def test_the_pretrain_bound_is_the_fonts_count():
    from noisydml.sections.pretrain import PRETRAIN_SOURCE_CLASSES
    from noisydml.data.glyphs import source_chars

    assert len(source_chars()) == PRETRAIN_SOURCE_CLASSES["glyphs"]


@pytest.mark.parametrize("script", sorted(p.name for p in (REPO / "scripts").glob("*.py")))
def test_every_script_answers_help(script):
    result = subprocess.run([sys.executable, f"scripts/{script}", "--help"], capture_output=True, text=True,
                            cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and result.stdout.strip()


def test_a_mistyped_profile_is_named_with_the_allowed_ones():
    result = subprocess.run([sys.executable, "-m", "noisydml.tools.console", "profile", "show", "prism/no_such"],
                            capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 2 and "'prism/no_such'" in result.stderr and "prism/table1_cub" in result.stderr
    assert "Traceback" not in result.stderr
