"""Every value of params.yaml's ``train``, ``pretrain`` and ``methods`` sections beside where it comes from.

    python scripts/default_sources.py [--method sgps] [--source tuned] [--check]

The sources are ``params.sources.yaml`` (its header defines them: paper, authors, library, tuned, ours, or ``as``
another method's key). ``--check`` exits 1 naming every key that is listed nowhere or twice, every pattern that
matches nothing, every ``tuned`` entry whose values are no longer params.yaml's, and every ``as`` whose value
differs from the method it names (tests/test_default_sources.py runs it).
"""

from __future__ import annotations

import argparse
import fnmatch
import sys
from pathlib import Path
from typing import Iterator

import yaml

from noisydml.tracking import flatten

REPO = Path(__file__).resolve().parents[1]
SOURCES = ("paper", "authors", "library", "tuned", "ours", "as")
SECTIONS = ("train", "pretrain")


def _matches(pattern: str, key: str) -> bool:
    parts, want = key.split("."), pattern.split(".")
    return len(parts) >= len(want) and all(fnmatch.fnmatchcase(k, w) for k, w in zip(parts, want)) and (
        len(parts) == len(want) or want[-1] == "*")


def entries(spec: dict) -> Iterator[tuple[str, str, dict]]:
    """(source, key pattern, details) of one section's or method's entry."""
    for source, body in spec.items():
        if source not in SOURCES:
            raise ValueError(f"source {source!r} is not one of {SOURCES}")
        if source == "tuned":
            for item in body:
                for key, value in zip(item["keys"], item["values"], strict=True):
                    yield source, key, {"value": value, "how": " ".join(item["how"].split())}
        elif source == "as":
            for other, keys in body.items():
                for key in keys:
                    yield source, key, {"method": other}
        else:
            for key in body:
                yield source, key, {}


def table(params: dict, sources: dict) -> tuple[list[dict], list[str]]:
    """Rows (where, key, value, source, note) for every leaf, and the problems found."""
    rows, problems = [], []
    scopes = [(s, params[s], sources.get(s, {})) for s in SECTIONS] + [
        (f"methods.{m}", body, sources.get("methods", {}).get(m, {})) for m, body in params["methods"].items()]
    for where, body, spec in scopes:
        if not spec:
            problems.append(f"{where}: no entry in params.sources.yaml")
            continue
        listed = list(entries(spec))
        used = set()
        for key, value in flatten(body).items():
            hits = [(i, e) for i, e in enumerate(listed) if _matches(e[1], key)]
            if len(hits) != 1:
                problems.append(f"{where}.{key}: listed {len(hits)} times in params.sources.yaml "
                                f"({', '.join(e[0] + ':' + e[1] for _, e in hits) or 'nowhere'}); allowed: once")
            if not hits:
                continue
            used.update(i for i, _ in hits)
            source, _, details = hits[0][1]
            note = details.get("how", "")
            if source == "tuned" and details["value"] != value:
                problems.append(f"{where}.{key}: params.yaml has {value!r}, its tuned entry {details['value']!r}: "
                                "re-tune it, or say where the new value comes from")
            if source == "as":
                other = details["method"]
                theirs = flatten(params["methods"].get(other, {})).get(key, "<missing>")
                note = f"= methods.{other}.{key}"
                if theirs != value:
                    problems.append(f"{where}.{key}: {value!r}, but it is listed as methods.{other}'s, which is "
                                    f"{theirs!r}")
            rows.append({"where": where, "key": key, "value": value, "source": source, "note": note})
        problems += [f"{where}: pattern {e[0]}:{e[1]} matches no key of params.yaml"
                     for i, e in enumerate(listed) if i not in used]
    return rows, problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", type=Path, default=REPO / "params.yaml")
    parser.add_argument("--sources", type=Path, default=REPO / "params.sources.yaml")
    parser.add_argument("--method", help="only this method's keys")
    parser.add_argument("--source", choices=SOURCES, help="only keys of this source")
    parser.add_argument("--check", action="store_true", help="print only problems; exit 1 when there are any")
    args = parser.parse_args()
    rows, problems = table(yaml.safe_load(args.params.read_text()), yaml.safe_load(args.sources.read_text()))
    if args.check:
        print("\n".join(problems) or f"{len(rows)} values, each with one source")
        sys.exit(1 if problems else 0)
    for row in rows:
        if args.method and row["where"] != f"methods.{args.method}" or args.source and row["source"] != args.source:
            continue
        print(f"{row['where']}.{row['key']} = {row['value']!r}  [{row['source']}] {row['note']}".rstrip())
    counts = {s: sum(r["source"] == s for r in rows) for s in SOURCES}
    print(f"{len(rows)} values: " + ", ".join(f"{n} {s}" for s, n in counts.items()), file=sys.stderr)
    for problem in problems:
        print(f"problem: {problem}", file=sys.stderr)


if __name__ == "__main__":
    main()
