"""Words a newcomer cannot follow stay out of the code and the docs.

The tracker's issue numbers, "the seed" for an external design (name it by its public title:
Pulsar PIP-468 scalable topics, Fibril's live repartition, Danube's load manager; docs/design/
describes each), paths into directories that are not in this repository, and measurement rounds
named by their order ("Fifth pass": a section of docs/benchmarks.md is named by what it found).

And in the README and docs/: every link, anchor, repository path (`src/...`, `tests/...`) and
module name (`danube.storage.owner_fence`) points at something that exists, so a page does not
send a newcomer to a file that moved or a section that was renamed.
"""

from __future__ import annotations

import re
from functools import cache
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


# Paths the docs name that are not files of this repository on purpose: run outputs (gitignored)
# and a file of Danube's own test suite that conformance.md says is replaced.
NOT_IN_REPOSITORY = ("bench/out/", "tests/test.blob")
LINK = re.compile(r"\]\(([^)\s]+)\)")
REPO_PATH = re.compile(r"(?<![\w./-])((?:src|tests|bench|docs|proto|ci|spark)/[\w./*<>{}-]+)")
MODULE = re.compile(r"(?<![\w.])(danube(?:\.[a-z_][a-z0-9_]*)+)")


def _doc_pages():
    yield ROOT / "README.md"
    yield from sorted((ROOT / "docs").rglob("*.md"))


@cache
def _anchors(page: Path) -> frozenset[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens, -1, -2 on repeats."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in page.read_text().splitlines():
        heading = re.match(r"#+ (.*)", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            found.add(slug if n == 0 else f"{slug}-{n}")
    return frozenset(found)


def _module_exists(name: str) -> bool:
    """A module or package of src/, or a name its source defines or imports (a function, a constant)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        base = ROOT / "src" / Path(*parts[:i])
        sources = [base.with_suffix(".py"), base.with_suffix(".pyx"), base / "__init__.py"]
        if not (base.is_dir() or any(source.exists() for source in sources)):
            continue
        rest = parts[i:]
        if not rest:
            return True
        if len(rest) > 1:
            return False
        text = "".join(source.read_text() for source in sources if source.exists())
        return re.search(rf"\b{rest[0]}\b", text) is not None
    return False


def test_doc_links_paths_and_modules_exist():
    broken = []
    for page in _doc_pages():
        text = page.read_text()
        where = page.relative_to(ROOT)
        for match in LINK.finditer(text):
            target = match.group(1)
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"{where}: link to {target}: no such file")
            elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
                broken.append(f"{where}: link to {target}: no such section")
        for match in REPO_PATH.finditer(text):
            path = match.group(1).rstrip(".,:;")
            if any(c in path for c in "*<>{}") or path.startswith(NOT_IN_REPOSITORY):
                continue  # a pattern, or not in the repository on purpose
            if not (ROOT / path).exists():
                broken.append(f"{where}: {path}: no such file or directory")
        for match in MODULE.finditer(text):
            if not _module_exists(match.group(1)):
                broken.append(f"{where}: {match.group(1)}: no such module")
    assert broken == [], "docs pointing at nothing:\n" + "\n".join(sorted(set(broken)))
