"""Where a target's package goes in a sibling repo, and the packages the repo already keeps.

``sync`` and ``adopt`` write only at the package path of ``contractgen.toml``, and only beside the
target's own code: the package's parent folder (its *anchor*: ``miles/backends/fsdp_utils`` for
the fsdp target, ``miles`` for the launcher, both in one miles checkout) must exist, or they
refuse with one line naming it (``MissingAnchorError``, exit 2) and write nothing. When the
package is missing but the repo keeps a true-on-policy package of this target elsewhere (the
public Megatron-LM fork's ``miles_megatron_plugins/true_on_policy``), they refuse and print the
config line to add instead of creating a second, unused package; another target's package in the
same repo (miles: the launcher's beside the fsdp one) is not "elsewhere".
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_NAME = "true_on_policy"
MARKERS = ("schema.py", "contracts.py")  # what every public copy of the package holds
_SKIP = {".git", ".hg", ".venv", "venv", "node_modules", "build", "dist", "__pycache__",
         "site-packages", ".tox", ".mypy_cache", ".ruff_cache", ".pytest_cache"}  # fmt: skip
MAX_DEPTH = 6


def find_packages(repo: Path) -> list[str]:
    """Relative POSIX paths of ``…/true_on_policy`` folders holding a schema.py or contracts.py
    (tests and examples left out), shortest first."""
    found: list[str] = []
    root = repo.resolve()
    for folder, dirs, files in os.walk(root):
        here = Path(folder)
        rel = here.relative_to(root)
        dirs[:] = sorted(
            d for d in dirs
            if d not in _SKIP and not d.startswith(".") and len(rel.parts) < MAX_DEPTH
        )  # fmt: skip
        if rel.parts and rel.parts[0] in ("tests", "test", "examples", "docs"):
            dirs[:] = []
            continue
        if here.name == PACKAGE_NAME and any(m in files for m in MARKERS):
            found.append(rel.as_posix())
    return sorted(found, key=lambda p: (p.count("/"), p))


def config_lines(target: str, package: str, contracts: tuple[str, ...] | None = None) -> str:
    """The ``contractgen.toml`` lines that point ``target`` at ``package``."""
    lines = [f"[targets.{target}]", f'package = "{package}"']
    if contracts:
        lines.append("contracts = [" + ", ".join(f'"{c}"' for c in contracts) + "]")
    return "\n".join(lines)


class WrongRepoError(ValueError):
    """``--repo NAME=PATH`` points at another target's repo (a usage error, exit 2)."""


def wrong_repo(repo: Path, target: str, package: str, others: dict[str, str]) -> str:
    """Why ``repo`` looks like another target's checkout ('' when it does not): it lacks
    ``package`` but holds the package another target (``others``: target -> package) writes."""
    if (repo / package).is_dir():
        return ""
    for other, their in sorted(others.items()):
        if their != package and (repo / their).is_dir():
            return (
                f"--repo {target}={repo}: this looks like {other}'s checkout (it holds {their}/, "
                f"not {package}/); pass --repo {target}=PATH with a checkout of {target}'s repo, "
                f"or --repo {other}={repo} to sync {other} there"
            )
    return ""


def misplaced(repo: Path, target: str, package: str, siblings: frozenset[str] = frozenset()) -> str:
    """Why writing ``package`` into ``repo`` would be a write elsewhere ('' when it is fine):
    the configured folder does not exist but the repo keeps its package at another path (not one
    of ``siblings``, the packages other targets of the same repo write)."""
    if (repo / package).is_dir():
        return ""
    others = [p for p in find_packages(repo) if p != package and p not in siblings]
    if not others:
        return ""
    return (
        f"{repo}: no {package}/ here, but the repo keeps its true-on-policy package in "
        f"{others[0]}/; refusing to write a second, unused package. Point contractgen at it "
        f"(contractgen.toml):\n{config_lines(target, others[0])}"
    )


class MissingAnchorError(FileNotFoundError):
    """A target's package would be written where the repo has none of that target's code."""


def anchor(package: str) -> str:
    """The folder a package is written into (its parent; ``.`` for a top-level package)."""
    return Path(package).parent.as_posix()


def missing_anchor(repo: Path, target: str, package: str, repo_name: str) -> str:
    """One line saying which anchor of ``target`` is missing from ``repo`` ('' when it is there)."""
    where = anchor(package)
    if (repo / package).is_dir() or (repo / where).is_dir():
        return ""
    return (
        f"--repo {target}={repo}: no {where}/ there, the folder {target}'s package {package}/ "
        f"goes in; point it at a {repo_name} checkout that has {where}/, or set "
        f'[targets.{target}] package = "…" in contractgen.toml'
    )
