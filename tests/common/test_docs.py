"""The docs say what is: the README's layout table, docs/architecture.md (every module),
no reference that cannot be followed from the repository."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def layout_paths(readme: str) -> list[str]:
    """The backticked paths in the first column of the README's ``## Layout`` table."""
    section = readme.split("## Layout", 1)[1].split("\n## ", 1)[0]
    paths = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.lstrip().startswith("|") and len(cells) > 1:
            paths += re.findall(r"`([^`]+)`", cells[0])
    return paths


def test_layout_table_parses_its_rows():
    table = "## Layout\n| path | what |\n| --- | --- |\n| `a/` | x |\n| `b/c.py` | y |\n## Next\n"
    assert layout_paths(table) == ["a/", "b/c.py"]


def test_every_path_in_the_readme_layout_exists():
    paths = layout_paths((ROOT / "README.md").read_text())
    assert len(paths) >= 6, paths
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert not missing, f"README.md's layout names paths that do not exist: {missing}"


def test_every_service_readme_exists_and_names_its_package():
    for service, package in {
        "sampler": "streamrec.sampler",
        "embedding-store": "streamrec.embedding_store",
        "trainer": "streamrec.trainer",
        "api": "streamrec.api",
    }.items():
        text = (ROOT / "services" / service / "README.md").read_text()
        assert package in text, f"services/{service}/README.md does not name {package}"


#: docs/architecture.md's paragraph of each directory under services/
ARCHITECTURE_SECTIONS = {
    "common": "**Shared**",
    "sampler": "**Sampler**",
    "embedding-store": "**Embedding store**",
    "trainer": "**Trainer**",
    "datagen": "**Data generator**",
    "api": "**API**",
    "control": "**Control contract**",
    "observability": "**Observability**",
    "launcher": "**Launcher**",
}


def architecture_section(text: str, heading: str) -> str:
    """The text of ``heading``'s paragraphs, up to the next service's heading or section."""
    start = text.index(heading)
    ends = [text.find(h, start + 1) for h in ARCHITECTURE_SECTIONS.values()]
    ends.append(text.find("\n## ", start))
    return text[start : min([e for e in ends if e > start] or [len(text)])]


def test_architecture_names_every_module_under_services():
    """A newcomer finds every module in docs/architecture.md, under its own service."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    services = sorted(p.name for p in (ROOT / "services").iterdir() if p.is_dir())
    assert set(ARCHITECTURE_SECTIONS) >= {s for s in services if s != "__pycache__"}
    missing = []
    for service, heading in ARCHITECTURE_SECTIONS.items():
        section = architecture_section(text, heading)
        for path in sorted((ROOT / "services" / service).rglob("*.py")):
            if path.name in ("__init__.py", "__main__.py"):
                continue
            rel = path.relative_to(ROOT / "services" / service).as_posix()
            if f"`{rel}`" not in section and f"`{path.name}`" not in section:
                missing.append(f"services/{service}/{rel}")
    assert not missing, f"docs/architecture.md does not name: {missing}"


#: a reference to an issue tracker or to a seed file, neither of which is in the repository
_UNFOLLOWABLE = re.compile(r"\b[Ii]ssues? #?\d+|\bseed[ -]0\d\d\b")


def test_no_reference_that_cannot_be_followed_from_the_repository():
    """Code and docs point at in-repo docs (docs/design-notes.md), never at "issue N"."""
    samples = ("issue " + "12", "issues " + "11, 12", "seed-" + "002")  # (not matching here)
    assert all(_UNFOLLOWABLE.search(t) for t in samples)
    assert not _UNFOLLOWABLE.search("reissue 3 seeds 0, 1")
    files = [ROOT / n for n in ("README.md", "BENCHMARKS.md", "RELIABILITY.md", "Makefile")]
    files += [ROOT / "pyproject.toml", ROOT / "setup.py", ROOT / ".importlinter"]
    files += [ROOT / "Dockerfile", ROOT / "Dockerfile.gpu"]
    for top in ("services", "docs", "tests", "bench", "tools", "deploy"):
        files += [
            p
            for p in (ROOT / top).rglob("*")
            if p.is_file()
            and (
                p.suffix in {".py", ".md", ".cpp", ".h", ".cu", ".cuh", ".yaml"}
                or "Dockerfile" in p.name
            )
        ]
    found = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in files
        if p.exists()
        for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
        if _UNFOLLOWABLE.search(line)
    ]
    assert not found, f"references to follow elsewhere: {found}"
