"""Write rendered files safely: check first, temp file + ``os.replace``, never outside a root."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path, PurePosixPath


class UnsafePathError(ValueError):
    """A destination would leave the directory it must stay in."""


def safe_destination(root: Path, relative: str) -> Path:
    """``root/relative``, refusing absolute paths, ``..`` and symlinks that lead outside ``root``."""
    rel = PurePosixPath(relative)
    if rel.is_absolute() or ".." in rel.parts or "\\" in relative or not rel.parts:
        raise UnsafePathError(f"{relative!r}: refusing a path that is absolute or contains '..'")
    root_real = root.resolve()
    dest = root.joinpath(*rel.parts)
    # Every existing component must resolve inside the root: a symlinked folder could point out.
    probe = root
    for part in rel.parts:
        probe = probe / part
        if probe.is_symlink() or probe.exists():
            real = probe.resolve()
            if real != root_real and root_real not in real.parents:
                raise UnsafePathError(
                    f"{probe}: resolves to {real}, outside {root_real}; refusing to write through it"
                )
    return dest


def atomic_write(dest: Path, content: bytes) -> None:
    """Write ``content`` to ``dest`` through a temp file in the same folder and ``os.replace``."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        if dest.exists():
            os.chmod(tmp, dest.stat().st_mode & 0o777)
        else:
            os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
