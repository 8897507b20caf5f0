"""What a fresh clone shows before anything runs: the last committed run's report, tables and figures (git-tracked
outputs, ``cache: false``), ``dvc plots show`` with and without ``--json``, and a report a reader can take as is
(names instead of ids, no ``nan``, no empty CSV, README references that lead somewhere).

CI runs this in its clean clone before its own pipeline run, which is the case that matters: there the outputs are
exactly what git holds.
"""

import json
import re
import subprocess
import sys

import pandas as pd
import pytest
import yaml

from conftest import REPO

#: The stages whose outputs a reader looks at: all in git.
SHOWN_STAGES = ("report", "bspml_maps")


def _outputs(stage: dict) -> list[tuple[str, dict]]:
    """(path, options) of every out, metric and plot a stage declares."""
    out = []
    for key in ("outs", "metrics", "plots"):
        for entry in stage.get(key, []):
            path, options = next(iter(entry.items())) if isinstance(entry, dict) else (entry, {})
            out.append((path, options or {}))
    return out


def _stages() -> dict:
    return yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]


def _tracked(path: str) -> list[str]:
    return subprocess.run(["git", "ls-files", "--", path], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout.split()


def test_every_output_a_reader_looks_at_is_in_git():
    stages = _stages()
    for name in SHOWN_STAGES:
        stage = stages[name]["do"] if "do" in stages[name] else stages[name]
        for path, options in _outputs(stage):
            assert options.get("cache") is False, f"{name}: {path} is cached: a fresh clone would not have it"
    report = stages["report"]
    for path, _ in _outputs(report):
        assert _tracked(path), f"{path}: declared by the report stage but not committed"
    for key in yaml.safe_load((REPO / "params.yaml").read_text())["figures"]["bspml_maps"]:
        assert _tracked(f"reports/bspml_maps/{key}.png") and _tracked(f"reports/bspml_maps/{key}.csv")
    for path in yaml.safe_load((REPO / "dvc.yaml").read_text())["plots"]:
        assert _tracked(path), f"top-level plot {path}: not committed"


def _dvc(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dvc", *args], cwd=REPO, capture_output=True, text=True)


def test_dvc_plots_show_works_on_the_committed_outputs(tmp_path):
    shown = _dvc("plots", "show", "--json")
    assert shown.returncode == 0, shown.stderr
    plots = json.loads(shown.stdout)
    assert not plots.get("errors"), plots.get("errors")
    data = plots.get("data", plots)
    figures = {str(p.relative_to(REPO)) for p in (REPO / "reports").rglob("*.png")}
    assert figures and figures <= set(data), figures - set(data)
    page = _dvc("plots", "show", "-o", str(tmp_path / "html"))
    assert page.returncode == 0 and "failed to load" not in (page.stdout + page.stderr).lower(), page.stderr
    assert (tmp_path / "html" / "index.html").is_file()


def test_the_committed_report_reads_as_a_paper():
    md = (REPO / "reports" / "results.md").read_text()
    main = md.split("\n## ", 1)[0]
    assert not re.search(r"\bnan\b", md, re.IGNORECASE)
    for noise in yaml.safe_load((REPO / "params.yaml").read_text())["grid"]["noises"]:
        assert not re.search(rf"\| {noise} (P@1|MAP@R|R@)", main), f"the main table heads a column by the id {noise!r}"
    assert "final_diag_" not in md and "sym50" not in md.split("## The papers' tables beside ours")[0]
    for image in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md):  # every figure it embeds exists
        assert (REPO / "reports" / image).is_file(), image
    for csv in (REPO / "reports").rglob("*.csv"):  # every CSV has a header at least
        pd.read_csv(csv)


#: A README reference in generated text: README "<heading>" (the heading's words, as the README writes them).
README_REFERENCE = re.compile(r'README:? \\?"([^"\\]+)\\?"')


def _headings() -> set[str]:
    return {line.lstrip("#").strip() for line in (REPO / "README.md").read_text().splitlines()
            if line.startswith("#")}


@pytest.mark.parametrize("where", ["reports/results.md", "src", "stages", "scripts", "params.yaml", "dvc.yaml",
                                   ".github", "docs"])
def test_every_readme_reference_names_a_heading_that_exists(where):
    """The report's text (and every comment, docstring and page that points at the README) names a heading the
    README has: ``README "<heading>"``."""
    path = REPO / where
    files = sorted(p for p in path.rglob("*") if p.suffix in (".py", ".md", ".yml", ".yaml")) if path.is_dir() \
        else [path]
    headings = _headings()
    for file in files:
        text = file.read_text()
        if where == "reports/results.md" or "reporting" in file.parts or "studies" in file.parts:
            assert "see the README" not in text, f"{file}: the report says which README heading"
        for heading in README_REFERENCE.findall(text):
            assert heading in headings, f"{file}: README \"{heading}\" is no heading of README.md"
