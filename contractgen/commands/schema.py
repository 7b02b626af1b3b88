"""``contractgen schema``: the JSON Schema of a contract file."""

from __future__ import annotations

import click

from ..schema.export import schema_json


@click.command("schema")
def command() -> None:
    """Print the JSON Schema (2020-12) of a contract file on stdout."""
    click.echo(schema_json(), nl=False)
