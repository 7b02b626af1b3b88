"""The generated folder's safety: ``generate`` writes and deletes only in a folder that lies
inside the project and holds nothing but files contractgen wrote (their header says so)."""

from __future__ import annotations

from .config import ConfigError, ProjectConfig
from .fingerprint import split_generated


def check_generated_dir(
    config: ProjectConfig, rendered: dict[str, bytes], foreign: bool = True
) -> None:
    """Raise ConfigError (``contractgen.toml:L:C: generated: …``) unless generate may use it
    (``foreign=False``: only that it lies inside the project, for read-only ``check``)."""
    problem = generated_dir_problem(config, rendered, foreign)
    if problem:
        raise ConfigError(f"{config.generated_where}: generated: {problem}")


def generated_dir_problem(
    config: ProjectConfig, rendered: dict[str, bytes], foreign: bool = True
) -> str:
    """Why ``generate`` must not write or delete in the generated folder ('' when it may).

    The folder must resolve inside the project (a symlink could lead out) and hold only files
    contractgen wrote (its header), so removing orphans can never delete someone's file.
    """
    root, gen = config.root.resolve(), config.generated_dir.resolve()
    if gen == root or root not in gen.parents:
        return f"{config.generated_dir} resolves to {gen}, outside the project {root}"
    if not gen.is_dir() or not foreign:
        return ""
    found = []
    for path in sorted(gen.rglob("*")):
        if "__pycache__" in path.parts or path.is_dir():
            continue
        rel = path.relative_to(gen).as_posix()
        if rel in rendered:
            continue
        if not path.is_file() or split_generated(path.read_bytes()[:65536]) is None:
            if path.name.startswith(".") and path.name.endswith(".tmp"):
                continue  # an interrupted write of ours: removed by generate, reported by check
            found.append(rel)
    if found:
        shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
        return (
            f"{config.generated_dir.name}/ holds files contractgen did not write ({shown}); "
            "point generated at a folder of its own"
        )
    return ""
