"""Build the optional native core ``shardfeed._native`` (C: CRC-32C, TFRecord framing,
batched tf.train.Example parsing into numpy arrays).

Metadata lives in pyproject.toml; this file only declares the extension. numpy's headers
are needed at build time (``numpy`` in ``[build-system] requires``). If the extension
cannot be built (no compiler, no numpy headers, a compile error) installation still
succeeds with a warning, and shardfeed uses its pure-Python path
(``shardfeed.formats.native.native_info()`` says why). Set ``SHARDFEED_REQUIRE_NATIVE=1``
to make a failed build an error instead (CI), and ``SHARDFEED_NATIVE_CFLAGS`` to add
compiler flags (for example ``-fsanitize=address``).
"""

from __future__ import annotations

import os
import shlex
import sys
import warnings

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

NATIVE_DIR = os.path.join("src", "shardfeed", "_native")
SOURCES = ["module.c", "bufpool.c", "packbytes.c", "crc32c.c", "frames.c", "crcfuse.c", "example_encode.c",
           "example_parse.c", "resample.c", "imgcheck.c", "imgrows.c", "permute.c",
           "gatherframes.c", "indextext.c", "mapfile.c"]
HEADERS = ["bufpool.h", "packbytes.h", "crc32c.h", "frames.h", "crcfuse.h", "example_encode.h", "example_parse.h",
           "resample.h", "imgcheck.h", "imgrows.h", "permute.h",
           "gatherframes.h", "indextext.h", "mapfile.h"]


def _numpy_include() -> list[str]:
    try:
        import numpy
    except ImportError:
        return []
    return [numpy.get_include()]


def _require_native() -> bool:
    return os.environ.get("SHARDFEED_REQUIRE_NATIVE", "").strip() not in ("", "0", "false", "no")


class OptionalBuildExt(build_ext):
    """build_ext that turns a failed compile into a warning (the pure-Python path remains)."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - any failure here must not stop the install
            self._failed(exc)

    def build_extension(self, ext: Extension) -> None:
        if not _numpy_include():
            self._failed(RuntimeError("numpy is not importable at build time (its headers are needed)"))
            return
        ext.include_dirs = list(ext.include_dirs) + _numpy_include()
        if self.compiler.compiler_type == "unix":
            ext.extra_compile_args = ["-O3", "-std=c11", "-fvisibility=hidden", "-Wall", "-Wno-unused-function"]
            extra = os.environ.get("SHARDFEED_NATIVE_CFLAGS", "")
            if extra:
                ext.extra_compile_args += shlex.split(extra)
                ext.extra_link_args = list(ext.extra_link_args) + shlex.split(extra)
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001
            self._failed(exc)

    def _failed(self, exc: BaseException) -> None:
        if _require_native():
            raise exc
        msg = (f"shardfeed: the native extension could not be built ({type(exc).__name__}: {exc}); "
               "installing the pure-Python version (slower parsing and framing)")
        warnings.warn(msg, stacklevel=2)
        print("WARNING: " + msg, file=sys.stderr)


setup(
    ext_modules=[
        Extension(
            "shardfeed._native",
            sources=[os.path.join(NATIVE_DIR, s) for s in SOURCES],
            depends=[os.path.join(NATIVE_DIR, h) for h in HEADERS],
            include_dirs=[NATIVE_DIR],
            define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
            optional=not _require_native(),
        )
    ],
    cmdclass={"build_ext": OptionalBuildExt},
)
