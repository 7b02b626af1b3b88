"""Package discovery for the design card's layout.

The import package is ``contractgen``; its subpackages live in top-level folders (``schema/``,
``codegen/``, ``adapters/``, ...) mapped by ``package-dir`` in pyproject.toml. setuptools' own
``find`` cannot see through that mapping, so the list is computed here from the folders.
Folders that hold only package data (the Jinja templates) are listed as packages too: setuptools
warns about, and will stop shipping, data in a folder that is not a listed package.
"""

from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).parent
# import name -> folder (must agree with [tool.setuptools] package-dir in pyproject.toml)
MAPPED = {
    "contractgen": "contractgen",
    "contractgen.schema": "schema",
    "contractgen.codegen": "codegen",
    "contractgen.adapters": "adapters",
    "contractgen.contracts": "contracts",
    "contractgen.generated": "generated",
}
# folders of package data with no __init__.py, each listed with every folder below it
DATA_FOLDERS = {"contractgen.codegen": "templates"}


def _packages() -> list[str]:
    found = []
    for name, folder in MAPPED.items():
        base = ROOT / folder
        found.append(name)
        for init in sorted(base.rglob("__init__.py")):
            rel = init.parent.relative_to(base)
            if rel.parts and "__pycache__" not in rel.parts:
                found.append(".".join((name, *rel.parts)))
    for name, sub in DATA_FOLDERS.items():
        base = ROOT / MAPPED[name]
        for folder in [base / sub, *sorted((base / sub).rglob("*"))]:
            if folder.is_dir() and "__pycache__" not in folder.parts:
                found.append(".".join((name, *folder.relative_to(base).parts)))
    return sorted(set(found))


setup(packages=_packages())
