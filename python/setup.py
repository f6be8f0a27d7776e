"""Builds libattn into the package when the attn sources are beside it.

`pip install ./python` from a checkout runs CMake on the repository root
(the directory above this one) and copies libattn.so into the package, so
the wheel is self-contained: a Release build (ATTN_BUILD_TYPE picks another
CMake build type), ATTN_BUILD_JOBS jobs. An existing build of the checkout
is reused: the directory in ATTN_BUILD_DIR, or else the checkout's `build/`
(what `make` builds) when it is of the same build type and carries no
sanitizer; CMake then rebuilds only what changed since, nothing when the
sources match. Otherwise the build goes to python/build/cmake. With
ATTN_SKIP_BUILD=1 nothing is built, and the package finds libattn at run
time: ATTN_LIBRARY, then the system's (`cmake --install`, ldconfig).
Without the sources beside it (an sdist carries none, and `python -m build`
builds its wheel from the sdist it has just made) the build refuses, saying
what to run, where it would make a wheel without libattn.
"""
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


def _skip_build():
    return os.environ.get("ATTN_SKIP_BUILD") == "1"


def _want_build():
    return _sources_present() and not _skip_build()


def _no_sources_message():
    return (f"attn: no libattn sources beside this package ({ROOT} has no CMakeLists.txt and "
            "include/attn.h: an sdist carries none), so the wheel would hold no libattn. "
            "`python -m build ./python` builds the wheel from the sdist it has just made: run "
            "`python -m build --wheel ./python` (or `pip wheel ./python`) in the repository "
            "instead; or set ATTN_SKIP_BUILD=1 for a package without libattn that loads "
            "ATTN_LIBRARY or the system's (cmake --install) at import")


def _cache_entries(build_dir):
    """CMakeCache.txt's NAME:TYPE=VALUE entries as {NAME: VALUE}."""
    entries = {}
    try:
        with open(os.path.join(build_dir, "CMakeCache.txt"), encoding="utf-8") as f:
            for line in f:
                name, sep, value = line.rstrip("\n").partition("=")
                if sep and not line.startswith(("#", "//")):
                    entries[name.partition(":")[0]] = value
    except OSError:
        pass
    return entries


def _reusable_build(build_type):
    """An existing CMake build of this checkout that gives the library the
    package would build, or None."""
    given = os.environ.get("ATTN_BUILD_DIR")
    if given:
        return os.path.abspath(given)
    candidate = os.path.join(ROOT, "build")
    cache = _cache_entries(candidate)
    if not cache or os.path.realpath(cache.get("CMAKE_HOME_DIRECTORY", "")) != \
            os.path.realpath(ROOT):
        return None
    if cache.get("CMAKE_BUILD_TYPE") != build_type:
        return None
    # ATTN_FUZZ turns the sanitizers and libFuzzer's coverage on by itself
    instrumented = ("ATTN_SANITIZE", "ATTN_TSAN", "ATTN_ALLOC_FAILURE_INJECTION", "ATTN_FUZZ")
    if any(cache.get(opt, "OFF").upper() in ("ON", "1", "TRUE", "YES") for opt in instrumented):
        return None
    return candidate


class BuildWithLibattn(build_py):
    def run(self):
        if not _skip_build() and not _sources_present():
            raise RuntimeError(_no_sources_message())
        super().run()
        if not _want_build():
            return
        jobs = os.environ.get("ATTN_BUILD_JOBS", "2")
        build_type = os.environ.get("ATTN_BUILD_TYPE", "Release")
        build_dir = _reusable_build(build_type)
        if build_dir:
            print(f"attn: reusing the build in {build_dir} (CMake rebuilds what changed)")
        else:
            build_dir = os.path.join(HERE, "build", "cmake")
            subprocess.check_call(["cmake", "-S", ROOT, "-B", build_dir,
                                   "-DCMAKE_BUILD_TYPE=" + build_type,
                                   "-DATTN_BUILD_TESTS=OFF"])
        subprocess.check_call(["cmake", "--build", build_dir, "--target", "attn_shared",
                               "-j", jobs])
        # the file the build's libattn.so link names: a build directory may
        # also hold libraries of older versions
        built = [os.path.realpath(os.path.join(build_dir, name))
                 for name in ("libattn.so", "libattn.dylib")
                 if os.path.exists(os.path.join(build_dir, name))]
        if not built:
            raise RuntimeError(f"attn: CMake built no libattn in {build_dir}")
        # An editable install (pip install -e) imports the package from this
        # directory, not from build_lib, which setuptools then discards: the
        # library goes beside the sources, as setuptools asks of editable builds.
        if getattr(self, "editable_mode", False):
            target = os.path.join(HERE, "attn")
        else:
            target = os.path.join(self.build_lib, "attn")
        os.makedirs(target, exist_ok=True)
        shutil.copyfile(built[0], os.path.join(target, "libattn.so"))


class BinaryDistribution(Distribution):
    """A wheel with libattn in it is platform-specific."""

    def has_ext_modules(self):
        return _want_build()


setup(cmdclass={"build_py": BuildWithLibattn}, distclass=BinaryDistribution)
