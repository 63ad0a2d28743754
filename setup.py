"""Builds the compiled parts; everything else is declared in pyproject.toml.

C++ CPU extensions, compiled with torch's cpp_extension and OpenMP:

- ``streamrec.embedding_store._C`` from ``services/embedding-store/csrc/cpu/*.cpp``
- ``streamrec.sampler._C`` from ``services/sampler/csrc/*.cpp``
- ``streamrec.trainer._C`` from ``services/trainer/csrc/*.cpp`` (the TSV line parser and the
  slot text parser: single-threaded, no OpenMP use, so they do not compete with torch's threads)

Only each extension's binding files include torch (``bindings.cpp``; the store's also its
``bind*.cpp``, an op family each: the tensor checks, the outputs, the Python API); the other
sources are plain C++ over raw arrays, so they compile in seconds (a torch header alone costs
~7 s per file here).

Install with ``pip install -e . --no-build-isolation`` so the build sees the installed torch
(an isolated build would download another one).

``STREAMREC_SANITIZE=address,undefined`` (what ``make sanitize`` sets) builds them with those
sanitizers instead, at -O1 with frame pointers, for ``setup.py build_ext --build-lib DIR``
into a directory of their own (tests/sanitize/run.sh); the installed build never has them.
"""

import os
from pathlib import Path

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

ROOT = Path(__file__).parent
EXTENSIONS = {
    "streamrec.embedding_store._C": ROOT / "services/embedding-store/csrc/cpu",
    "streamrec.sampler._C": ROOT / "services/sampler/csrc",
    "streamrec.trainer._C": ROOT / "services/trainer/csrc",
}

COMPILE_ARGS = ["-O3", "-fopenmp", "-std=c++17", "-ffp-contract=off", "-fvisibility=hidden"]
LINK_ARGS = ["-fopenmp"]
SANITIZE = os.environ.get("STREAMREC_SANITIZE", "")
if SANITIZE:
    # -fno-wrapv: Python's CFLAGS carry -fwrapv, under which signed overflow is not UB and
    # UBSan would not report it; -fno-sanitize-recover: a finding stops the run
    sanitize = [f"-fsanitize={SANITIZE}", "-fno-sanitize-recover=all"]
    COMPILE_ARGS = COMPILE_ARGS[1:] + ["-O1", "-g", "-fno-omit-frame-pointer", "-fno-wrapv"]
    COMPILE_ARGS += sanitize
    LINK_ARGS = LINK_ARGS + sanitize

ext_modules = []
for name, source_dir in EXTENSIONS.items():
    sources = sorted(str(p.relative_to(ROOT)) for p in source_dir.glob("*.cpp"))
    if sources:
        ext_modules.append(
            CppExtension(
                name=name,
                sources=sources,
                extra_compile_args=COMPILE_ARGS,
                extra_link_args=LINK_ARGS,
            )
        )

setup(
    ext_modules=ext_modules,
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
