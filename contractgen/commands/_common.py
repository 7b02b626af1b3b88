"""What every command shares: project loading, error reporting, exit codes."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ..codegen.config import CONFIG_NAME, ConfigError, ProjectConfig
from ..codegen.locate import WrongRepoError
from ..codegen.paths import builtin_config
from ..codegen.writer import UnsafePathError
from ..project import Project, open_project
from ..schema.errors import ContractError

EXIT_OK, EXIT_DRIFT, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports Ctrl-C


def fail(message: str, code: int = EXIT_USAGE) -> None:
    click.echo(message, err=True)
    sys.exit(code)


def handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn invalid input into exit 2 with the problems on stderr, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ContractError as exc:
            for problem in exc.problems:
                click.echo(str(problem), err=True)
            sys.exit(EXIT_USAGE)
        except ConfigError as exc:  # already ``contractgen.toml:LINE:COL: key: message``
            fail(str(exc))
        except (UnsafePathError, FileNotFoundError, WrongRepoError) as exc:
            fail(f"error: {exc}")
        except OSError as exc:  # permissions, a full disk: one line naming the path
            fail(f"error: {os_error_line(exc)}")
        except KeyError as exc:
            # KeyError's own str() quotes its argument; errors that explain themselves keep theirs
            own_str = type(exc).__str__ is not KeyError.__str__
            fail(f"error: {exc if own_str or not exc.args else exc.args[0]}")

    return wrapper


def os_error_line(exc: OSError) -> str:
    """An OS error as one line that names the path: ``PATH: Permission denied``."""
    if exc.filename and exc.strerror:
        return f"{exc.filename}: {exc.strerror}"
    return str(exc)


def project_from(ctx: click.Context) -> Project:
    root: Path | None = ctx.obj.get("root") if ctx.obj else None
    contracts: Path | None = ctx.obj.get("contracts") if ctx.obj else None
    return open_project(root, contracts)


def project_to_write(ctx: click.Context, verb: str) -> Project:
    """The project a writing command (``generate``, ``new``, ``add-checkpoint``) writes into; exit
    2 when there is none but the installed contractgen's own contracts (no contractgen.toml at or
    above the current directory, and contractgen installed as a package, not a checkout):
    nothing is ever written into an installed package."""
    project = project_from(ctx)
    root = project.config.root
    if not (root / CONFIG_NAME).is_file() and root.resolve() == builtin_config().root.resolve():
        fail(
            f"error: {verb}: no contractgen.toml in {Path.cwd()} or above, so the only project is "
            f"the installed contractgen's ({root}), which is never written; make a project: a "
            "folder with a contractgen.toml (it may be empty) and a contracts/ folder with the "
            f"contracts to start from (copy them from {project.config.contracts_dir}), then run "
            "the command there or pass --root"
        )
    return project


def use_project_from(ctx: click.Context) -> Project:
    """Open the project (--root, --contracts, contractgen.toml) and make the vendored modules that
    plan, handshake and parity read come from it, for this command only (the previous selection
    is put back when its context closes); invalid contracts exit 2 here."""
    from ..codegen.vendored import restore_project, use_project

    project = project_from(ctx)
    previous = use_project(project.config)
    ctx.call_on_close(lambda: restore_project(previous))
    return project


def parse_repo_options(
    values: tuple[str, ...], config: ProjectConfig | None = None
) -> list[tuple[str, Path]]:
    """``(target, PATH)`` pairs; NAME is a target of ``config``'s registry (sglang, megatron,
    launcher, fsdp, a plugin's) or a repo name, which stands for every target of that repo."""
    from ..codegen.drift import resolve_target_names

    repos: list[tuple[str, Path]] = []
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            raise click.BadParameter(
                f"{value!r}: expected NAME=PATH, e.g. sglang=../sglang", param_hint="--repo"
            )
        try:
            targets = resolve_target_names(name, config)
        except KeyError as exc:
            raise click.BadParameter(str(exc.args[0]), param_hint="--repo") from None
        for target in targets:
            if any(t == target for t, _ in repos):
                raise click.BadParameter(f"{target} given twice", param_hint="--repo")
            repos.append((target, Path(path)))
    return repos


def absent_packages(
    values: tuple[str, ...], repos: list[tuple[str, Path]], config: ProjectConfig
) -> list[tuple[str, Path]]:
    """The targets a repo name stood for (``--repo miles=PATH``: launcher and fsdp) whose package
    that repo does not hold, while it holds another of them: a repo keeps the packages it
    adopted, not every one it could hold. A target named on its own (``--repo fsdp=PATH``), or a
    repo that holds none of its packages, is required (missing files are drift)."""
    named = {value.partition("=")[0] for value in values}
    implied = [(t, path) for t, path in repos if t not in named]
    absent = [(t, path) for t, path in implied if not (path / config.package(t)).is_dir()]
    held = {path for t, path in implied if (t, path) not in absent}
    return [(t, path) for t, path in absent if path in held]
