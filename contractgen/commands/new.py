"""``contractgen new``: scaffold the next version of a contract, linked by ``supersedes``."""

from __future__ import annotations

from pathlib import Path

import click
from pydantic import TypeAdapter, ValidationError

from ..codegen.breaking.compare import newest, next_id
from ..codegen.scaffold import ScaffoldError, scaffold
from ..codegen.writer import atomic_write, safe_destination
from ..schema.models import ContractId
from ._common import fail, handle_errors, project_to_write

_CONTRACT_ID = TypeAdapter(ContractId)


@click.command("new")
@click.option("--from", "from_id", required=True, metavar="OLD_ID", help="Contract to copy.")
@click.option(
    "--id", "new_id", default=None, metavar="NEW_ID",
    help="Id of the new contract (default: the next free _vN of OLD_ID's name).",
)  # fmt: skip
@click.option("--dry-run", is_flag=True, help="Print the new file instead of writing it.")
@click.pass_context
@handle_errors
def command(ctx: click.Context, from_id: str, new_id: str | None, dry_run: bool) -> None:
    """Copy contract OLD_ID to NEW_ID.yaml with the id changed and `supersedes: OLD_ID`.

    A new version keeps the name and bumps _vN (qwen3_dense_true_on_policy_v2 -> _v3) and
    supersedes OLD_ID; an id with another name starts a new line (e.g. a new architecture copied
    from the closest contract) and supersedes nothing. Comments and formatting are kept. Refuses
    (exit 2, nothing written) when NEW_ID exists or is not a valid id, when OLD_ID already has a
    newer version, or when the copy does not validate.
    """
    project = project_to_write(ctx, "new")
    old = project.contract(from_id)
    ids = [lc.id for lc in project.contracts]
    new_id = new_id if new_id is not None else next_id(from_id, ids)
    try:
        _CONTRACT_ID.validate_python(new_id)
    except ValidationError:
        fail(
            f"error: --id {new_id!r}: a contract id is lowercase letters, digits and '_' ending "
            f"in _v<N>, at most 80 characters (e.g. {next_id(from_id, ids)})"
        )
    if new_id in ids:
        fail(
            f"error: --id {new_id!r}: contract exists; pick a new id (e.g. {next_id(from_id, ids)})"
        )
    same_line = _line(new_id) == _line(from_id)
    if same_line and _version(new_id) <= _version(from_id):
        fail(
            f"error: --id {new_id!r}: a new version of {from_id} numbers above it "
            f"(e.g. {next_id(from_id, ids)})"
        )
    successor = next((lc.id for lc in project.contracts if lc.contract.supersedes == from_id), None)
    if same_line and successor is not None:
        latest = newest(from_id, project.contracts)
        fail(
            f"error: --from {from_id!r}: already superseded by {successor!r}; start from the "
            f"newest of its line: contractgen new --from {latest} --id {next_id(latest, ids)}"
        )
    contracts_dir = project.config.contracts_dir
    dest = safe_destination(contracts_dir, f"{new_id}.yaml")
    shown = _display(dest, project.config.root)
    if dest.exists():
        fail(f"error: {shown} exists; pick a new id or remove the file")
    try:
        content = scaffold(old.source, new_id, from_id if same_line else None, shown)
    except ScaffoldError as exc:
        fail(f"error: {exc}")
    if dry_run:
        click.echo(content.decode("utf-8"), nl=False)
        return
    atomic_write(dest, content)
    if same_line:
        click.echo(f"new: wrote {shown} (a copy of {from_id} that supersedes it)")
    else:
        click.echo(
            f"new: wrote {shown} (a copy of {from_id}; a new contract line, so it supersedes "
            "nothing)"
        )
    click.echo(
        "next:\n"
        f"  1. change the numerics in {shown}, and its header comment and description\n"
        "  2. contractgen generate\n"
        "  3. contractgen breaking --against main   (clean: only a contract was added)\n"
        "  4. contractgen sync --repo sglang=PATH --repo megatron=PATH --repo launcher=PATH"
    )


def _line(contract_id: str) -> str:
    """The name of a contract's line: its id without the ``_v<N>`` suffix."""
    return contract_id.rpartition("_v")[0]


def _version(contract_id: str) -> int:
    return int(contract_id.rpartition("_v")[2])


def _display(path: Path, root: Path) -> str:
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return path.as_posix()
