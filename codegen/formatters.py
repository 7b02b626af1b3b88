"""Each target repo's formatters, run as libraries in memory, and the one form they all keep.

A target may name the formatters its repo runs (``[targets.NAME.format]`` in contractgen.toml:
``black = { line-length = 119 }``, ``isort = { profile = "black", line-length = 119 }``). Every
vendored file is rendered in the form that all of them leave unchanged (found here, before the
stamp), so a fresh sync passes each repo's own ``black --check`` / ``isort --check`` and the
copies stay byte-identical across repos; the stamp then hashes those bytes. No directive that
switches a formatter off is ever written. Settings that admit no common form are a
``FormatConflict`` naming the targets whose formatters keep undoing each other.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

# option name in contractgen.toml -> (type, keyword of the library)
BLACK_OPTIONS = {
    "line-length": (int, "line_length"),
    "skip-string-normalization": (bool, "skip_string_normalization"),
    "skip-magic-trailing-comma": (bool, "skip_magic_trailing_comma"),
}
ISORT_OPTIONS = {
    "profile": (str, "profile"),
    "line-length": (int, "line_length"),
    "known-first-party": (list, "known_first_party"),
}
TOOLS = {"black": BLACK_OPTIONS, "isort": ISORT_OPTIONS}
MAX_ROUNDS = 6


class FormatConflict(ValueError):
    """The configured formatters admit no common form of a file (exit 2 at ``generate``)."""


@dataclass(frozen=True)
class Formatter:
    """One formatter of one target, with its settings (hashable, for the cache)."""

    target: str
    tool: str  # "black" | "isort"
    options: tuple[tuple[str, object], ...]

    def describe(self) -> str:
        shown = " ".join(f"--{k}" if v is True else f"--{k} {v}" for k, v in self.options if v)
        return f"{self.target}'s {self.tool}{' ' + shown if shown else ''}"

    def apply(self, source: str) -> str:
        return _apply(self.tool, self.options, source)


@lru_cache(maxsize=512)
def _apply(tool: str, options: tuple[tuple[str, object], ...], source: str) -> str:
    given = {TOOLS[tool][k][1]: v for k, v in options}
    if tool == "black":
        import black

        mode = black.Mode(
            line_length=given.get("line_length", 88),
            string_normalization=not given.get("skip_string_normalization", False),
            magic_trailing_comma=not given.get("skip_magic_trailing_comma", False),
        )
        return black.format_str(source, mode=mode)
    import isort

    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in given.items()}
    return isort.code(source, config=isort.Config(**kwargs))


def parse_format(
    value: object, where: str
) -> tuple[tuple[str, tuple[tuple[str, object], ...]], ...]:
    """``[targets.NAME.format]`` as ``((tool, options), …)``; a ValueError names the bad key."""
    if not isinstance(value, dict):
        raise ValueError(f"{where}: must be a table, e.g. black = {{ line-length = 119 }}")
    out = []
    for tool, options in value.items():
        if tool not in TOOLS:
            raise ValueError(f"{where}.{tool}: unknown formatter (known: {', '.join(TOOLS)})")
        if not isinstance(options, dict):
            raise ValueError(
                f"{where}.{tool}: must be a table of settings, e.g. {{ line-length = 100 }}"
            )
        known = TOOLS[tool]
        for key, setting in options.items():
            if key not in known:
                raise ValueError(
                    f"{where}.{tool}.{key}: unknown setting (known: {', '.join(known)})"
                )
            kind = known[key][0]
            if not isinstance(setting, kind) or (kind is int and isinstance(setting, bool)):
                raise ValueError(
                    f"{where}.{tool}.{key}: must be a {kind.__name__} (got {setting!r})"
                )
        settings = ((k, tuple(v) if isinstance(v, list) else v) for k, v in options.items())
        out.append((tool, tuple(sorted(settings, key=lambda kv: kv[0]))))
    return tuple(out)


def formatters_of(
    config_format: dict[str, tuple], targets: list[str] | None = None
) -> tuple[Formatter, ...]:
    """The formatters of ``targets`` (default: every target), in target order."""
    return tuple(
        Formatter(target, tool, opts)
        for target, tools in sorted(config_format.items())
        if targets is None or target in targets
        for tool, opts in tools
    )


def cache_dir() -> Path | None:
    """Where common forms are kept across processes: ``CONTRACTGEN_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/contractgen`` (``~/.cache/contractgen``); ``CONTRACTGEN_CACHE_DIR=""``
    turns the cache off. Formatting a large ``schema.py`` with every repo's black and isort
    takes seconds; the result is a pure function of the source, the settings and the
    formatters' versions, which name the entry."""
    given = os.environ.get("CONTRACTGEN_CACHE_DIR")
    if given is not None:
        return Path(given) / "format" if given else None
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "contractgen" / "format"


def _cache_key(source: str, formatters: tuple[Formatter, ...]) -> str:
    import black
    import isort

    h = hashlib.sha256(f"black {black.__version__} isort {isort.__version__}\n".encode())
    h.update(repr([(f.tool, f.options) for f in formatters]).encode())
    h.update(b"\0" + source.encode())
    return h.hexdigest()


@lru_cache(maxsize=256)
def common_form(source: str, formatters: tuple[Formatter, ...], path: str) -> str:
    """``source`` in the form every formatter leaves unchanged (a round in which none of them
    changed it); FormatConflict when they keep undoing each other. Kept in ``cache_dir()``."""
    folder = cache_dir() if formatters else None
    entry = folder / _cache_key(source, formatters) if folder else None
    try:
        return (
            entry.read_text(encoding="utf-8") if entry else _common_form(source, formatters, path)
        )
    except OSError:  # not cached yet (or unreadable): compute it
        pass
    form = _common_form(source, formatters, path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-")
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as out:
            out.write(form)
        os.replace(tmp, entry)
    except OSError:  # a read-only home: no cache, same result
        pass
    return form


def _common_form(source: str, formatters: tuple[Formatter, ...], path: str) -> str:
    current = source
    changed_by: list[str] = []
    for _ in range(MAX_ROUNDS):
        changed_by = []
        for formatter in formatters:
            after = formatter.apply(current)
            if after != current:
                changed_by.append(formatter.describe())
            current = after
        if not changed_by:  # every formatter, in turn, left it as it was
            return current
    undoing = list(dict.fromkeys(changed_by))
    raise FormatConflict(
        f"{path}: the formatters of contractgen.toml admit no common form: "
        f"{' and '.join(undoing) or ', '.join(f.describe() for f in formatters)} keep reformatting "
        "each other's output; make their settings agree (e.g. one line length) under "
        "[targets.NAME.format]"
    )
