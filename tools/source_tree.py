"""Lays the installed package ``streamrec`` out as one directory tree of symlinks.

The services live in ``services/<name>/`` and are mapped onto ``streamrec.<name>`` by
pyproject's ``package-dir``; an editable install resolves that with an import hook, which
static tools (mypy, import-linter's grimp) cannot follow. They read this tree instead:

    python tools/source_tree.py build/srctree   # then: PYTHONPATH=build/srctree mypy -p streamrec
"""

from __future__ import annotations

import shutil
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build(out: Path) -> Path:
    """Makes ``out/streamrec`` (replacing it) from pyproject's package-dir; returns it."""
    mapping: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"][
        "setuptools"
    ]["package-dir"]
    top = out / "streamrec"
    if top.exists():
        shutil.rmtree(top)
    for package in sorted(mapping, key=lambda p: p.count(".")):
        target = out.joinpath(*package.split("."))
        target.mkdir(parents=True, exist_ok=True)
        for source in sorted((ROOT / mapping[package]).glob("*.py")):
            (target / source.name).symlink_to(source)
    return top


if __name__ == "__main__":
    print(build(Path(sys.argv[1] if len(sys.argv) > 1 else "build/srctree").resolve()))
