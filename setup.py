"""Package layout (metadata is in pyproject.toml): ``engine*`` as is, and the dashboard installed as
``privacy_lab_app`` (the repository's app.py, app_pages/, .streamlit/ and assets/), which
``privacy-lab app`` runs with ``streamlit run``."""
from setuptools import find_packages, setup
from setuptools.command.build_py import build_py


class BuildPy(build_py):
    """privacy_lab_app maps to the repository root: of its modules take app.py only (not setup.py)."""

    def find_package_modules(self, package, package_dir):
        mods = super().find_package_modules(package, package_dir)
        return [m for m in mods if package != "privacy_lab_app" or m[1] == "app"]


setup(
    packages=find_packages(include=["engine", "engine.*"]) + ["privacy_lab_app", "privacy_lab_app.app_pages"],
    package_dir={"privacy_lab_app": ".", "privacy_lab_app.app_pages": "app_pages"},
    package_data={"privacy_lab_app": [".streamlit/*.toml", "assets/**/*"]},
    cmdclass={"build_py": BuildPy},
)
