"""Builds the Cython core (every ``src/danube/_core/*.pyx``) with -O3 and no -march.

Set ``DANUBE_NO_EXTENSIONS=1`` at build time to install the pure-Python twins only.
"""

import os
import sys
from glob import glob

from setuptools import Extension, setup

CORE = os.path.join("src", "danube", "_core")
# Hand-written C lives apart from _core so that every .c under _core is a generated (ignored) file.
CSRC = os.path.join("src", "danube", "_csrc")
# C sources compiled into a given module besides its .pyx
EXTRA_SOURCES = {
    "frame": [os.path.join(CSRC, "crc32c_impl.c")],
}


def extensions():
    if os.environ.get("DANUBE_NO_EXTENSIONS", "") not in ("", "0"):
        return []
    from Cython.Build import cythonize

    modules = []
    for pyx in sorted(glob(os.path.join(CORE, "*.pyx"))):
        name = os.path.splitext(os.path.basename(pyx))[0]
        sources = [pyx] + [s for s in EXTRA_SOURCES.get(name, []) if os.path.exists(s)]
        modules.append(
            Extension(
                f"danube._core.{name}",
                sources=sources,
                include_dirs=[CORE, CSRC],
                extra_compile_args=["-O3", "-std=c11"] if sys.platform != "win32" else ["/O2"],
            )
        )
    return cythonize(
        modules,
        language_level="3",
        compiler_directives={"embedsignature": True, "freethreading_compatible": False},
    )


setup(ext_modules=extensions())
