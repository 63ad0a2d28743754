"""The docs say what is: every path the README's layout table names exists."""

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
