"""Builds and installs the Python module `bnfold` (python/) with CMake.

`pip install --no-build-isolation .` runs this: CMake configures the checkout into $BNFOLD_BUILD_DIR (default
build/, the folder scripts/setup.sh builds, so a set-up checkout only relinks) with this interpreter, builds the
module's target and packages python/bnfold with it. docs/python.md has the commands for Debian 12.
"""

import os
import re
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


def project_version():
    with open(os.path.join(ROOT, "CMakeLists.txt"), encoding="utf-8") as cmake_lists:
        return re.search(r"project\(bnfold VERSION ([0-9.]+)", cmake_lists.read()).group(1)


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build_dir = os.environ.get("BNFOLD_BUILD_DIR", os.path.join(ROOT, "build"))
        jobs = os.environ.get("BNFOLD_JOBS", str(os.cpu_count() or 2))
        configure = ["cmake", "-S", ROOT, "-B", build_dir, "-DBNFOLD_PYTHON=ON",
                     f"-DPYTHON_EXECUTABLE={sys.executable}"]
        if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
            configure.append("-DCMAKE_BUILD_TYPE=RelWithDebInfo")
        subprocess.check_call(configure)
        subprocess.check_call(["cmake", "--build", build_dir, "--parallel", jobs, "--target", "bnfold_python"])
        built = os.path.join(build_dir, "python", "bnfold")
        native = [name for name in os.listdir(built) if name.startswith("_native") and name.endswith(".so")]
        if len(native) != 1:
            raise RuntimeError(f"expected one _native*.so in {built}, found {native}")
        destination = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(destination), exist_ok=True)
        shutil.copyfile(os.path.join(built, native[0]), destination)


# setuptools' own scratch folders go inside CMake's build folder, not beside the sources.
os.makedirs(os.path.join(ROOT, "build"), exist_ok=True)

setup(
    name="bnfold",
    version=project_version(),
    description="Fold BatchNormalization into the layers around it in ONNX models",
    long_description="See docs/python.md.",
    license="see the repository",
    python_requires=">=3.9",
    package_dir={"": "python"},
    packages=["bnfold"],
    package_data={"bnfold": ["*.pyi", "py.typed"]},
    ext_modules=[Extension("bnfold._native", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    extras_require={"onnx": ["onnx"]},
    zip_safe=False,
    options={"build": {"build_base": os.path.join("build", "setuptools")}, "egg_info": {"egg_base": "build"}},
)
