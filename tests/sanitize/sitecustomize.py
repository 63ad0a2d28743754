"""Imports the compiled extensions from another build directory (make sanitize's).

With this directory on PYTHONPATH and STREAMREC_EXT_DIR set, ``streamrec.embedding_store._C``,
``streamrec.sampler._C`` and ``streamrec.trainer._C`` load from
``$STREAMREC_EXT_DIR/streamrec/<package>/`` (what ``setup.py build_ext --build-lib
$STREAMREC_EXT_DIR`` writes) instead of the installed package
directory; everything else imports as installed, and the installed build is never touched.
Processes the tests spawn inherit both variables, so they load the same build. An extension
missing there is an ImportError, never a silent fall back to the installed one.
"""

from __future__ import annotations

import os
import sys
from importlib.machinery import ModuleSpec, PathFinder
from pathlib import Path

EXTENSIONS = {
    "streamrec.embedding_store._C": "streamrec/embedding_store",
    "streamrec.sampler._C": "streamrec/sampler",
    "streamrec.trainer._C": "streamrec/trainer",
}


class ExtensionFinder:
    """A meta path finder for the extensions only, ahead of the editable install's."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> ModuleSpec | None:
        where = EXTENSIONS.get(fullname)
        if where is None:
            return None
        spec = PathFinder.find_spec(fullname, [str(self.root / where)])
        if spec is None:
            raise ImportError(f"{fullname}: no build of it under {self.root / where}")
        return spec


if os.environ.get("STREAMREC_EXT_DIR"):
    sys.meta_path.insert(0, ExtensionFinder(Path(os.environ["STREAMREC_EXT_DIR"])))
