"""Words a newcomer cannot follow stay out of the code and the docs.

The tracker's issue numbers, "the seed" for an external design (name it by its public title:
Pulsar PIP-468 scalable topics, Fibril's live repartition, Danube's load manager), paths into
directories that are not in this repository, and measurement rounds named by their order ("Fifth
pass": a section of docs/benchmarks.md is named by what it found).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WHERE = ("src", "docs", "bench", "tests", "proto", "ci")
SUFFIXES = {
    ".py",
    ".pyx",
    ".pxd",
    ".pyi",
    ".md",
    ".proto",
    ".sh",
    ".toml",
    ".yaml",
    ".yml",
    ".html",
    ".js",
    ".css",
    ".txt",
    ".json",
}
SKIP = {"__pycache__", "out", "results", ".venvs"}  # run outputs, not the project's text
WORDS = re.compile(
    r"\bissue[- ]?#?[0-9]+|\bthe seeds?\b|\bseeds/|\.\./shared|\bshared/(?!failover)"
    r"|\b(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth) (pass|session)\b",
    re.IGNORECASE,
)


def _files():
    yield ROOT / "README.md"
    for top in WHERE:
        for path in (ROOT / top).rglob("*"):
            if (
                path.suffix in SUFFIXES
                and path.is_file()
                and path != Path(__file__).resolve()
                and not SKIP.intersection(path.relative_to(ROOT).parts)
            ):
                yield path


def test_no_issue_numbers_seeds_outside_paths_or_numbered_passes():
    found = []
    for path in _files():
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if WORDS.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    assert found == [], "words a newcomer cannot follow (see this test's docstring):\n" + "\n".join(found)
