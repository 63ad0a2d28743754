"""Builds the compiled parts; everything else is declared in pyproject.toml.

C++ CPU extensions, compiled with torch's cpp_extension and OpenMP:

- ``streamrec.embedding_store._C`` from ``services/embedding-store/csrc/cpu/*.cpp``
- ``streamrec.sampler._C`` from ``services/sampler/csrc/*.cpp``

Install with ``pip install -e . --no-build-isolation`` so the build sees the installed torch
(an isolated build would download another one).
"""

from pathlib import Path

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

ROOT = Path(__file__).parent
EXTENSIONS = {
    "streamrec.embedding_store._C": ROOT / "services/embedding-store/csrc/cpu",
    "streamrec.sampler._C": ROOT / "services/sampler/csrc",
}

ext_modules = []
for name, source_dir in EXTENSIONS.items():
    sources = sorted(str(p.relative_to(ROOT)) for p in source_dir.glob("*.cpp"))
    if sources:
        ext_modules.append(
            CppExtension(
                name=name,
                sources=sources,
                extra_compile_args=["-O3", "-fopenmp", "-std=c++17", "-ffp-contract=off", "-fvisibility=hidden"],
                extra_link_args=["-fopenmp"],
            )
        )

setup(
    ext_modules=ext_modules,
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
