"""The README is a user's guide: short, every link inside the repository resolves, nothing points at files a user
does not have; docs/ holds the rest."""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
#: What users do not have: the development folders beside the repository and the issue tracker.
OUTSIDE = re.compile(r"\.\./shared|shared/papers|NOTES\.md|\bissue \d+\b")


def _links(text: str) -> list[str]:
    return [m.group(1) for m in re.finditer(r"\]\(([^)\s]+)\)", text) if "://" not in m.group(1)]


def _anchors(text: str) -> set[str]:
    """GitHub's anchors of a page's headings (lower case, punctuation dropped, spaces to hyphens)."""
    out, fence = set(), False
    for line in text.splitlines():
        fence ^= line.startswith("```")
        if not fence and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


def test_the_readme_is_a_guide_not_a_log():
    assert len((REPO / "README.md").read_text().splitlines()) < 400


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_resolves_inside_the_repository(page):
    text = page.read_text()
    assert not OUTSIDE.search(text), OUTSIDE.search(text).group(0)
    for link in _links(text):
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        assert target.is_relative_to(REPO) and target.exists(), link
        if anchor and target.suffix == ".md":
            assert anchor in _anchors(target.read_text()), link


def test_licence_and_citation_are_there():
    import yaml

    assert (REPO / "LICENSE").read_text().startswith("MIT License")
    citation = yaml.safe_load((REPO / "CITATION.cff").read_text())
    assert citation["cff-version"] == "1.2.0" and citation["license"] == "MIT" and citation["title"]
