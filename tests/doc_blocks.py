"""The READMEs' shell blocks, found in one place, and who runs each.

A block is a fenced block of README.md, services/*/README.md or deploy/k8s/README.md whose
language is a shell's (``sh``, ``bash``, ``shell``, ``console``), or an unlabelled one whose
first line is a command (``curl ...``, ``streamrec ...``, ``make ...``). It is named by its
file, the nearest heading above it and its place among the blocks under that heading.

Every block is either run as written by the test :data:`RUN_BY` names, which takes its text
from :func:`blocks_for` (so the registry names exactly what the test runs), or listed in
:data:`CANNOT_RUN` with the reason. tests/common/test_doc_blocks.py fails on a block that is
neither, on an entry that names no block, and on a registered test that does not call
:func:`blocks_for`.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHELL_LANGUAGES = frozenset({"sh", "bash", "shell", "console"})
#: The first word of an unlabelled block that makes it a command block.
COMMANDS = (
    "curl",
    "streamrec",
    "make",
    "kubectl",
    ".venv/bin/",
    "python",
    "torchrun",
    "redis-cli",
    "docker",
)
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*$")


@dataclass(frozen=True)
class BlockId:
    """Where a block is: ``file`` from the repository root, the ``heading`` above it (its
    text, no ``#``) and ``index``, 1 for the first shell block under that heading."""

    file: str
    heading: str
    index: int = 1

    def __str__(self) -> str:
        return f'{self.file}, "{self.heading}", block {self.index}'


@dataclass(frozen=True)
class Block:
    id: BlockId
    line: int  # of the opening fence, 1-based
    language: str
    text: str  # the body, its list indentation removed


def doc_files() -> list[Path]:
    """The documents whose shell blocks are inventoried."""
    services = sorted((ROOT / "services").glob("*/README.md"))
    return [ROOT / "README.md", *services, ROOT / "deploy" / "k8s" / "README.md"]


def is_command_block(language: str, text: str) -> bool:
    if language in SHELL_LANGUAGES:
        return True
    first = text.lstrip().split(maxsplit=1)
    return language == "" and bool(first) and first[0].startswith(COMMANDS)


def parse(path: Path) -> list[Block]:
    """The shell blocks of the Markdown file ``path``, in order."""
    return parse_text(path.relative_to(ROOT).as_posix(), path.read_text())


def parse_text(name: str, markdown: str) -> list[Block]:
    """The shell blocks of ``markdown``, the document ``name``, in order."""
    blocks: list[Block] = []
    heading = ""
    counts: dict[str, int] = {}
    lines = markdown.splitlines()
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if fence is None:
            if title := HEADING.match(lines[i]):
                heading = title.group(1)
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), len(lines))
        assert end < len(lines), f"{name}:{i + 1}: a fence that is never closed"
        text = textwrap.dedent("\n".join(lines[i + 1 : end])) + "\n"
        language = fence.group(2)
        if is_command_block(language, text):
            counts[heading] = counts.get(heading, 0) + 1
            blocks.append(Block(BlockId(name, heading, counts[heading]), i + 1, language, text))
        i = end + 1
    return blocks


def inventory() -> list[Block]:
    """Every shell block of every inventoried document."""
    return [block for path in doc_files() for block in parse(path)]


def unaccounted(blocks: list[Block]) -> list[str]:
    """A line for each of ``blocks`` that no test runs and no reason excuses."""
    run = {block_id for ids in RUN_BY.values() for block_id in ids}
    return [
        f"{block.id} (line {block.line}: {block.text.splitlines()[0].strip()!r}) is run by "
        "no test and has no reason in tests/doc_blocks.py CANNOT_RUN"
        for block in blocks
        if block.id not in run and block.id not in CANNOT_RUN
    ]


def find(block_id: BlockId) -> Block:
    found = [block for block in parse(ROOT / block_id.file) if block.id == block_id]
    assert found, f"no shell block {block_id} (was the heading renamed or a block removed?)"
    return found[0]


def blocks_for(test_file: str | Path) -> list[str]:
    """The text of each block :data:`RUN_BY` lists for ``test_file`` (a test's
    ``__file__``), in the registry's order: what that test runs as written."""
    name = Path(test_file).resolve().relative_to(ROOT).as_posix()
    assert name in RUN_BY, f"{name} runs README blocks: list them in tests/doc_blocks.py RUN_BY"
    return [find(block_id).text for block_id in RUN_BY[name]]


README = "README.md"
API = "services/api/README.md"
LAUNCHER = "services/launcher/README.md"
TRAINER = "services/trainer/README.md"
K8S = "deploy/k8s/README.md"
OWN_DATA = "Walk-through: your own data over REST"

#: test file -> the blocks it runs as written, in the order it runs them.
RUN_BY: dict[str, tuple[BlockId, ...]] = {
    "tests/e2e/test_pool.py": (BlockId(README, "Start and stop a job over REST"),),
    "tests/e2e/test_online_stack.py": (
        BlockId(API, "The job spec: every field does what it names, or is refused"),
    ),
    "tests/trainer/test_walkthrough.py": (
        BlockId(TRAINER, "Walk-through: a Criteo file, start to finish"),
    ),
    "tests/e2e/test_own_data_walkthrough.py": tuple(
        BlockId(TRAINER, OWN_DATA, i) for i in (1, 2, 3, 4)
    ),
    "tests/e2e/test_doc_blocks_stack.py": (
        BlockId(LAUNCHER, "A short run that stays up", 1),  # the stack, in the background
        BlockId(API, "REST (`/docs` has the OpenAPI UI)"),
        BlockId(LAUNCHER, "A short run that stays up", 2),  # `--help`, then `down`
    ),
}

NO_CLUSTER = "needs a Kubernetes API server (tests/deploy/test_manifests_run.py runs the manifests)"
SYNOPSIS = "a synopsis of a command's forms ([optional] parts, the reader's own files)"
#: block -> why no test here runs it.
CANNOT_RUN: dict[BlockId, str] = {
    BlockId(README, "StreamRec"): (
        "the whole demo (two days, minutes) and the whole suite (`make test` runs this test)"
    ),
    BlockId(README, "Run it on Kubernetes"): "needs a Docker engine and a Kubernetes API server",
    BlockId(API, "streamrec.api: the control plane"): (
        "a pod's command: /run/secrets, /data and /models are a pod's volumes"
    ),
    BlockId(LAUNCHER, "streamrec.launcher: the whole stack on one machine"): (
        "each a whole run of minutes; `serving` and `pw` are the reader's"
    ),
    BlockId(TRAINER, "streamrec.trainer — DLRM trainer workers"): SYNOPSIS,
    BlockId(TRAINER, "Real Criteo files (`streamrec-datagen --from-criteo`)"): (
        "the Criteo 1TB files download from the internet (the walk-through runs "
        "`--from-criteo` on a generated file)"
    ),
    BlockId(TRAINER, "Lay out an event log (`streamrec-datagen --from-events`)"): SYNOPSIS,
    **{BlockId(K8S, "What to set first", i): NO_CLUSTER for i in (1, 2)},
    BlockId(K8S, "Apply"): NO_CLUSTER,
    **{BlockId(K8S, "Start a job over REST", i): NO_CLUSTER for i in (1, 2, 4)},
    BlockId(K8S, "Start a job over REST", 3): "needs a Kubernetes cluster with GPUs (tier device)",
    BlockId(K8S, "Operations"): NO_CLUSTER,
}
