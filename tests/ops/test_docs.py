"""Every reference to the documentation resolves: no file cited is missing, and
every section a comment or a link names exists (docs/design.md, "Layout", says
where things are; a reader who follows a reference must land somewhere)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("config", "dispatcher", "mailer", "bench", "tests", "scripts", "deploy", "docs")
SUFFIXES = {".py", ".lua", ".toml", ".sh", ".yml", ".yaml", ".md", ".json"}
PAGES = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]


def source_files() -> list[Path]:
    files = [
        ROOT / name for name in ("README.md", "BENCHMARKS.md", "pyproject.toml", "Makefile", "Dockerfile")
    ]
    files += [ROOT / name for name in ("docker-compose.yml",) if (ROOT / name).exists()]
    for folder in SOURCES:
        files += [p for p in (ROOT / folder).rglob("*") if p.suffix in SUFFIXES and p.is_file()]
    return [f for f in files if f.exists() and "__pycache__" not in f.parts]


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def headings(page: Path) -> list[str]:
    text = re.sub(r"(?ms)^```.*?^```", "", page.read_text(encoding="utf-8"))
    return [m[1].strip() for m in re.finditer(r"(?m)^#{1,6} (.+)$", text)]


def test_every_cited_page_exists() -> None:
    missing = []
    for path in source_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for cited in set(re.findall(r"\b(docs/[\w-]+\.md|[A-Z][A-Z_]+\.md)\b", text)):
            if not (ROOT / cited).is_file():
                missing.append(f"{path.relative_to(ROOT)}: {cited}")
    assert missing == []


# `docs/design.md, "Layout"`, `docs/design.md ("SQS and SES facts")`, `docs/operations.md "Shutdown"`
CITED_SECTION = re.compile(r'\b((?:docs/)?[\w-]+\.md)(?:,|\s*\(|\s)\s*"([^"\n]+)"')


def test_every_cited_section_exists() -> None:
    pages = {str(p.relative_to(ROOT)): p for p in PAGES}
    pages.update({p.name: p for p in PAGES if p.parent == ROOT})
    wrong = []
    for path in source_files():
        for page, section in CITED_SECTION.findall(path.read_text(encoding="utf-8", errors="replace")):
            if page not in pages:
                continue
            if not any(h.startswith(section) or slug(h) == slug(section) for h in headings(pages[page])):
                wrong.append(f'{path.relative_to(ROOT)}: {page} "{section}"')
    assert wrong == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_of_a_page_resolves(page: Path) -> None:
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+://", target):
            continue
        file_part, _, anchor = target.partition("#")
        linked = (page.parent / file_part).resolve() if file_part else page
        if not linked.exists() or (
            anchor and linked.suffix == ".md" and anchor not in {slug(h) for h in headings(linked)}
        ):
            broken.append(target)
    assert broken == []


def test_the_readme_opens_with_the_two_commands() -> None:
    # A newcomer's first screen: what fairpost is, and how to see it run and test it.
    first_screen = "\n".join((ROOT / "README.md").read_text(encoding="utf-8").splitlines()[:40])
    assert "make demo" in first_screen and "make test" in first_screen
