"""Builds libattn into the package when the attn sources are beside it.

`pip install ./python` from a checkout runs CMake on the repository root
(the directory above this one) and copies libattn.so into the package, so
the wheel is self-contained: a Release build (ATTN_BUILD_TYPE picks another
CMake build type), ATTN_BUILD_JOBS jobs. Without the sources (or with
ATTN_SKIP_BUILD=1) nothing is built, and the package finds libattn at run
time: ATTN_LIBRARY, then the system's (`cmake --install`, ldconfig).
"""
import glob
import os
import shutil
import subprocess

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _sources_present():
    return os.path.exists(os.path.join(ROOT, "CMakeLists.txt")) and os.path.exists(
        os.path.join(ROOT, "include", "attn.h"))


def _want_build():
    return _sources_present() and os.environ.get("ATTN_SKIP_BUILD") != "1"


class BuildWithLibattn(build_py):
    def run(self):
        super().run()
        if not _want_build():
            return
        build_dir = os.path.join(HERE, "build", "cmake")
        jobs = os.environ.get("ATTN_BUILD_JOBS", "2")
        build_type = os.environ.get("ATTN_BUILD_TYPE", "Release")
        subprocess.check_call(["cmake", "-S", ROOT, "-B", build_dir,
                               "-DCMAKE_BUILD_TYPE=" + build_type, "-DATTN_BUILD_TESTS=OFF"])
        subprocess.check_call(["cmake", "--build", build_dir, "--target", "attn_shared",
                               "-j", jobs])
        built = sorted(glob.glob(os.path.join(build_dir, "libattn.so.*.*.*")) +
                       glob.glob(os.path.join(build_dir, "libattn.dylib")))
        if not built:
            raise RuntimeError(f"attn: CMake built no libattn in {build_dir}")
        target = os.path.join(self.build_lib, "attn")
        os.makedirs(target, exist_ok=True)
        shutil.copyfile(built[0], os.path.join(target, "libattn.so"))


class BinaryDistribution(Distribution):
    """A wheel with libattn in it is platform-specific."""

    def has_ext_modules(self):
        return _want_build()


setup(cmdclass={"build_py": BuildWithLibattn}, distclass=BinaryDistribution)
