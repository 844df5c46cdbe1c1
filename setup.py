"""The package list, found from the tree (everything else is in pyproject.toml).

Every package under ``rs_interp/`` is found, and the top-level ``hooks/`` folder installs as
``rs_interp.hooks`` (its subpackages as ``rs_interp.hooks.*``), never as a global ``hooks`` package.
pyproject.toml cannot say this alone: its ``packages.find`` names packages after their folders.
"""

from setuptools import find_namespace_packages, setup
from setuptools.command.build_py import build_py

HOOKS_DIR = "hooks"

# Namespace-style finding: a data folder such as rs_interp/toy_models/ (no __init__.py) is a package
# whose files are its data.
SKIP = ["*__pycache__*", "*.egg-info*"]
packages = find_namespace_packages(include=["rs_interp", "rs_interp.*"], exclude=SKIP)
packages += ["rs_interp.hooks"] + [f"rs_interp.hooks.{name}" for name in find_namespace_packages(HOOKS_DIR, exclude=SKIP)]



class BuildPy(build_py):
    """Test scaffolding never ships: a ``conftest.py`` under rs_interp/ (``_backend``'s tells pytest which
    TransformerLens version's modules to leave out of the doctests) stays out of the wheel, as MANIFEST.in keeps it
    out of the sdist (tests/integration/test_packaging.py)."""

    def find_package_modules(self, package, package_dir):
        return [m for m in super().find_package_modules(package, package_dir) if m[1] != "conftest"]


setup(packages=packages, package_dir={"rs_interp.hooks": HOOKS_DIR}, cmdclass={"build_py": BuildPy})
