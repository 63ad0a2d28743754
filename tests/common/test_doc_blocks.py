"""Every shell block of the READMEs is run as written by a test, or says why it cannot be.

The blocks and the registry of who runs them are tests/doc_blocks.py; the tests that run
blocks take them from there (``blocks_for(__file__)``), so what the registry claims is what
they run. A new block that is neither run nor excused fails here, naming its file and heading.
"""

from __future__ import annotations

import doc_blocks
from doc_blocks import CANNOT_RUN, ROOT, RUN_BY, BlockId, inventory, parse_text, unaccounted

DOC = """# Tool
Intro.
```
make demo    # an unlabelled block that starts with a command
```
```
created --start--> running
```
## Use it
```bash
curl -s $API/readyz
```
```yaml
key: value
```
```console
streamrec down
```
1. A step:
   ```sh
   kubectl get pods
   ```
### Deeper
```
.venv/bin/streamrec up --help
```
"""


def test_the_shell_blocks_are_found_by_file_heading_and_index():
    blocks = parse_text("docs/x.md", DOC)
    assert [(b.id, b.language, b.line) for b in blocks] == [
        (BlockId("docs/x.md", "Tool", 1), "", 3),
        (BlockId("docs/x.md", "Use it", 1), "bash", 10),
        (BlockId("docs/x.md", "Use it", 2), "console", 16),
        (BlockId("docs/x.md", "Use it", 3), "sh", 20),
        (BlockId("docs/x.md", "Deeper", 1), "", 24),
    ]
    assert blocks[3].text == "kubectl get pods\n"  # the list's indentation removed
    assert blocks[0].text.startswith("make demo ")


def test_a_new_block_that_no_test_runs_fails_naming_its_file_and_heading():
    (new,) = parse_text("services/api/README.md", "## Brand new\n```bash\ncurl -s $API\n```\n")
    (problem,) = unaccounted([new])
    assert 'services/api/README.md, "Brand new", block 1 (line 2' in problem, problem
    assert "CANNOT_RUN" in problem


def test_every_shell_block_of_the_readmes_is_run_by_a_test_or_says_why_not():
    blocks = inventory()
    files = {block.id.file for block in blocks}
    assert {"README.md", "services/api/README.md", "deploy/k8s/README.md"} <= files
    problems = unaccounted(blocks)
    assert not problems, "\n".join(problems)


def test_every_registry_entry_names_a_block_and_one_fate():
    found = {block.id for block in inventory()}
    claimed = [block_id for ids in RUN_BY.values() for block_id in ids]
    stale = [str(b) for b in [*claimed, *CANNOT_RUN] if b not in found]
    assert not stale, f"tests/doc_blocks.py names blocks the READMEs no longer have: {stale}"
    assert len(claimed) == len(set(claimed)), "a block is claimed by two tests"
    both = set(claimed) & set(CANNOT_RUN)
    assert not both, f"claimed as run and listed as not runnable: {[str(b) for b in both]}"
    assert all(reason.strip() for reason in CANNOT_RUN.values())


def test_every_test_in_the_registry_takes_its_blocks_from_it():
    for test_file, ids in RUN_BY.items():
        path = ROOT / test_file
        assert path.is_file(), f"RUN_BY names {test_file}, which does not exist"
        assert "blocks_for(__file__)" in path.read_text(), (
            f"{test_file} is said to run {[str(b) for b in ids]} but does not take them "
            "from doc_blocks.blocks_for(__file__)"
        )
        assert len(doc_blocks.blocks_for(path)) == len(ids)
