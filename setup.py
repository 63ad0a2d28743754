"""Builds the compiled parts; everything else is declared in pyproject.toml.

The embedding store's C++ CPU extension (``streamrec.embedding_store._C``) is compiled with
torch's cpp_extension and OpenMP. Install with ``pip install -e . --no-build-isolation`` so
the build sees the installed torch (an isolated build would download another one).
"""

from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).parent
CPU_DIR = ROOT / "services/embedding-store/csrc/cpu"
CPU_SOURCES = sorted(str(p.relative_to(ROOT)) for p in CPU_DIR.glob("*.cpp"))

ext_modules = []
cmdclass = {}
if CPU_SOURCES:
    from torch.utils.cpp_extension import BuildExtension, CppExtension

    ext_modules.append(
        CppExtension(
            name="streamrec.embedding_store._C",
            sources=CPU_SOURCES,
            extra_compile_args=["-O3", "-fopenmp", "-std=c++17"],
            extra_link_args=["-fopenmp"],
        )
    )
    cmdclass["build_ext"] = BuildExtension.with_options(use_ninja=True)

setup(ext_modules=ext_modules, cmdclass=cmdclass)
