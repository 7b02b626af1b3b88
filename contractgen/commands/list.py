"""``contractgen list``: the contracts with id, family and fingerprint."""

from __future__ import annotations

import json

import click

from ..codegen.fingerprint import contract_fingerprint
from ._common import handle_errors, project_from


@click.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array instead of a table.")
@click.pass_context
@handle_errors
def command(ctx: click.Context, as_json: bool) -> None:
    """List contracts: id, family, logprob contract and fingerprint."""
    project = project_from(ctx)
    rows = [
        {
            "id": lc.id,
            "family": lc.contract.family,
            "logprob_contract": lc.contract.identity.logprob_contract,
            "supersedes": lc.contract.supersedes,
            "fingerprint": contract_fingerprint(lc.contract.model_dump(mode="json")),
            "file": lc.path.name,
        }
        for lc in project.contracts
    ]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    width = max(len(r["id"]) for r in rows)
    for r in rows:
        click.echo(
            f"{r['id']:<{width}}  {r['family']:<12}  {r['logprob_contract']:<14}  {r['fingerprint'][:19]}"
        )
