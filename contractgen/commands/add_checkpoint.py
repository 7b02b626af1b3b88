"""``contractgen add-checkpoint``: add Hugging Face checkpoints to a contract's model profile.

Reads each ``config.json`` (any transformers dialect) through the contract's family module, writes
the checkpoint entry (dims, RoPE when it differs from the profile's, tied head, the TP/PP sizes its
dims allow) into the contract file as text, so comments and formatting survive, and validates
the result. Adding a checkpoint is a non-breaking change (``contractgen breaking``).
"""

from __future__ import annotations

from pathlib import Path

import click

from ..adapters.families import Family, family_for
from ..adapters.families.hf_config import (
    HFConfigError,
    dim_fields,
    hf_config_fields,
    unsupported,
)
from ..codegen.scaffold import ScaffoldError, add_checkpoints
from ..codegen.writer import atomic_write
from ..schema.models import Contract, ModelDims
from ..schema.rules import check_dims, check_layers_vs_pp, check_vocab_block
from ._common import fail, handle_errors, project_to_write


@click.command("add-checkpoint")
@click.argument("contract_id")
@click.argument(
    "hf_dirs", nargs=-1, required=True,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
)  # fmt: skip
@click.option(
    "--name", default=None, help="Checkpoint name (one HF_DIR only; default: its folder name)."
)
@click.option(
    "--tp-sizes", default=None, metavar="1,2",
    help="TP sizes the checkpoint supports (default: every contract TP size its dims split exactly).",
)  # fmt: skip
@click.option("--dry-run", is_flag=True, help="Print the new contract file instead of writing it.")
@click.pass_context
@handle_errors
def command(
    ctx: click.Context, contract_id: str, hf_dirs: tuple[Path, ...], name: str | None,
    tp_sizes: str | None, dry_run: bool,
) -> None:  # fmt: skip
    """Add the checkpoints in HF_DIR... to CONTRACT_ID's model profile.

    Refuses (exit 2, nothing written) a config the contract's family cannot run or that differs
    from the profile in a family-level field (architecture, activation, bias, norm eps), a name
    the profile already has, and an entry that does not validate.
    """
    if name is not None and len(hf_dirs) != 1:
        fail("error: --name names one checkpoint; give one HF_DIR with it")
    project = project_to_write(ctx, "add-checkpoint")
    loaded = project.contract(contract_id)
    contract = loaded.contract
    family = family_for(contract.family)
    explicit_tp = _sizes(tp_sizes) if tp_sizes is not None else None
    known = {d.name for d in contract.model_profile.checkpoints}
    entries: list[dict] = []
    for hf_dir in hf_dirs:
        entry = _entry(contract, family, hf_dir, name or hf_dir.name, explicit_tp)
        if entry["name"] in known:
            fail(f"error: {contract_id} already has a checkpoint named {entry['name']!r}")
        known.add(entry["name"])
        entries.append(entry)
    shown = _display(loaded.path, project.config.root)
    try:
        content = add_checkpoints(loaded.source, entries, shown)
    except ScaffoldError as exc:
        fail(f"error: {exc}")
    if dry_run:
        click.echo(content.decode("utf-8"), nl=False)
        return
    atomic_write(loaded.path, content)
    names = ", ".join(e["name"] for e in entries)
    click.echo(f"add-checkpoint: added {names} to {shown}")
    click.echo("next: contractgen generate && contractgen breaking --against main")


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(sorted({int(part) for part in text.split(",")}))
    except ValueError:
        fail(f"error: --tp-sizes {text!r}: expected comma-separated integers, e.g. 1,2,4")
    if not sizes or sizes[0] < 1:
        fail(f"error: --tp-sizes {text!r}: sizes are positive integers")
    return sizes


def _entry(
    contract: Contract, family: Family, hf_dir: Path, name: str, tp: tuple[int, ...] | None
) -> dict:
    """The checkpoint entry for one HF directory, in the order the contracts write it."""
    from ..adapters.families.hf_config import read_hf_config

    where = f"{hf_dir / 'config.json'}"
    try:
        fields = hf_config_fields(family, read_hf_config(hf_dir))
    except HFConfigError as exc:
        fail(f"error: {where}: {exc}")
    mp = contract.model_profile
    problems = unsupported(family, fields)
    for key, ours in (
        ("hf_architecture", mp.architectures.hf),
        ("activation", mp.activation),
        ("attention_bias", mp.attention_bias),
        ("norm_eps", mp.norm.eps),
    ):
        if fields[key] != ours and not any(p.startswith(key.split("_")[0]) for p in problems):
            problems.append(f"{key}={fields[key]!r} (the profile's: {ours!r})")
    if problems:
        fail(
            f"error: {where}: {contract.id} ({family.name}) cannot run this checkpoint: "
            + "; ".join(problems)
        )
    dims = dim_fields(family)  # the dense dims, then the MoE block's for an MoE family
    entry: dict = {"name": name, **{f: fields[f] for f in dims}}
    rope = fields["rope"]
    profile_rope = {
        "theta": mp.rope.theta,
        "scaling": None
        if mp.rope.scaling is None
        else mp.rope.scaling.model_dump(exclude_none=True),
    }
    if rope != profile_rope:
        entry["rope"] = rope
    layer_rules = (check_layers_vs_pp,)
    entry["pp_sizes"] = _supported(
        contract, entry, "pp_sizes", contract.parallel.training.pp, layer_rules
    )
    entry["tp_sizes"] = tp
    tp_rules = (check_dims, check_vocab_block)
    if tp is None:
        entry["tp_sizes"] = _supported(contract, entry, "tp_sizes", _all_tp(contract), tp_rules)
    tried = {"tp_sizes": (_all_tp(contract), tp_rules),
             "pp_sizes": (contract.parallel.training.pp, layer_rules)}  # fmt: skip
    for key in ("tp_sizes", "pp_sizes"):
        if entry[key] == ():
            sizes, rules = tried[key]
            first = _findings(contract, {**entry, key: sizes[:1]}, rules)
            why = f" ({first[0][1]})" if first and first[0] != "invalid" else ""
            fail(
                f"error: {where}: no {key.split('_')[0].upper()} size {contract.id} allows fits "
                f"this checkpoint ({name}){why}; it cannot run under this contract"
            )
    order = ["name", *dims[: dims.index("max_position_embeddings") + 1], "tp_sizes", "pp_sizes"]
    order += [*dims[dims.index("max_position_embeddings") + 1 :], "rope"]
    return {k: entry[k] for k in order if entry.get(k) is not None}


def _all_tp(contract: Contract) -> tuple[int, ...]:
    return tuple(sorted(set(contract.parallel.training.tp) | set(contract.parallel.rollout.tp)))


def _supported(contract: Contract, entry: dict, key: str, sizes: tuple[int, ...], rules: tuple):
    """The sizes of ``key`` the contract's own ``rules`` accept for this entry (None: all)."""
    ok = [s for s in sizes if not _findings(contract, {**entry, key: (s,)}, rules)]
    return None if tuple(ok) == tuple(sizes) else tuple(ok)


def _findings(contract: Contract, entry: dict, rules: tuple) -> list:
    try:
        dims = ModelDims.model_validate({k: v for k, v in entry.items() if v is not None})
    except ValueError:
        return ["invalid"]
    mp = contract.model_profile
    probe = contract.model_copy(
        update={"model_profile": mp.model_copy(update={"checkpoints": (*mp.checkpoints, dims)})}
    )
    path = f"model_profile.checkpoints.{len(mp.checkpoints)}"
    return [f for rule in rules for f in rule(probe) if f[0].startswith(path + ".")]


def _display(path: Path, root: Path) -> str:
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return path.as_posix()
