"""The wheel carries ``prebuilt/`` (support builds, their manifest, sources and headers) as ``flowdsl/_prebuilt``.

Everything else is in pyproject.toml. An editable install keeps reading ``prebuilt/``
in the source tree (``flowdsl.runtime.support_build.PREBUILT_DIR``).
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PREBUILT = Path(__file__).resolve().parent / "prebuilt"
#: What the runtime reads: the builds and manifest, and the sources a first-use build compiles.
PREBUILT_PARTS = ("build", "include", "src")


class BuildPyWithPrebuilt(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        target = Path(self.build_lib) / "flowdsl" / "_prebuilt"
        for part in PREBUILT_PARTS:
            shutil.copytree(PREBUILT / part, target / part, dirs_exist_ok=True)

    def get_outputs(self, include_bytecode=True):
        outputs = super().get_outputs(include_bytecode)
        if getattr(self, "editable_mode", False):
            return outputs
        target = Path(self.build_lib) / "flowdsl" / "_prebuilt"
        return outputs + [str(target / f.relative_to(PREBUILT)) for part in PREBUILT_PARTS
                          for f in sorted((PREBUILT / part).rglob("*")) if f.is_file()]


setup(cmdclass={"build_py": BuildPyWithPrebuilt})
