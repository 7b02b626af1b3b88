"""Package discovery for the design card's layout.

The import package is ``contractgen``; its subpackages live in top-level folders (``schema/``,
``codegen/``, ``adapters/``, ...) mapped by ``package-dir`` in pyproject.toml. setuptools' own
``find`` cannot see through that mapping, so the list is computed here from the folders.
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


def _packages() -> list[str]:
    found = []
    for name, folder in MAPPED.items():
        base = ROOT / folder
        found.append(name)
        for init in sorted(base.rglob("__init__.py")):
            rel = init.parent.relative_to(base)
            if rel.parts and "__pycache__" not in rel.parts:
                found.append(".".join((name, *rel.parts)))
    return sorted(set(found))


setup(packages=_packages())
