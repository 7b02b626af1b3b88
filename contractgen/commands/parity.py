"""``contractgen parity``: the exact-zero gate between rollout and trainer logprobs."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from ._common import EXIT_DRIFT, EXIT_OK, fail, handle_errors

DEFAULT_CONTRACT = "qwen3_dense_true_on_policy_v1"
DEFAULT_LAYOUTS = "tp1,tp2,pp2,cp2"


@click.command("parity")
@click.option(
    "--contract", "contract_id", default=DEFAULT_CONTRACT, show_default=True, help="Contract id."
)
@click.option(
    "--checkpoint", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
    help="Hugging Face checkpoint directory (config.json + *.safetensors). Default: the contract's "
    "tiny reference model with seeded random weights.",
)  # fmt: skip
@click.option(
    "--layouts", default=None,
    help=f"Comma-separated layouts (default: {DEFAULT_LAYOUTS}, plus tp2pp2 where the model allows).",
)  # fmt: skip
@click.option(
    "--dtype", type=click.Choice(["contract", "float32"]), default="contract", show_default=True,
    help="'float32' sets every dtype of the contract to float32: a diagnostic mode for reference "
    "checks, marked as such in the report.",
)  # fmt: skip
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the JSON report here ('-' for stdout).")  # fmt: skip
@click.option(
    "--inject-faults",
    is_flag=True,
    help="Flip every policy field on one side; each must be detected.",
)
@click.option("--quiet", is_flag=True, help="No progress lines on stderr.")
@handle_errors
def command(
    contract_id: str, checkpoint: Path | None, layouts: str | None, dtype: str, device: str,
    json_path: Path | None, inject_faults: bool, quiet: bool,
) -> None:  # fmt: skip
    """Compare rollout and trainer logprobs bitwise at every layout.

    Runs the reference rollout (several requests, prefill + decode with a KV cache) and the
    trainer forward on real megatron-core (gloo processes on CPU), and compares every scored
    token's logprob with torch.equal. Exit 0 only when every layout is exact and, with
    --inject-faults, every fault is detected; 1 otherwise; 2 for invalid input.
    """
    # Worker processes inherit this: megatron-core warns at import that Apex and Transformer
    # Engine are absent, which is expected here (the contract's layers replace their kernels).
    os.environ.setdefault(
        "PYTHONWARNINGS",
        "ignore:Apex is not installed:UserWarning,"
        "ignore:Transformer Engine and Apex are not installed:UserWarning",
    )
    from ..parity.gate import check_layouts, passed, run_gate, table
    from ..parity.harness import GateConfig
    from ..parity.layouts import LayoutError, layout_problems, parse_layouts
    from ..parity.rollout import model_arch
    from ..vendored import load_target

    schema = load_target("sglang").schema
    schema.get_contract_schema(contract_id)  # unknown ids: exit 2 listing the known ones
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            fail("error: --device cuda: no CUDA device is available here")
    weights: object
    if checkpoint is None:
        from ..adapters.sglang.model import ModelArch, random_weights

        arch = ModelArch.from_profile(schema.model_profile_for(contract_id))
        weights = random_weights(arch, seed=0)
    else:
        from ..adapters.sglang.checkpoint import CheckpointError, check_checkpoint

        try:  # a checkpoint the profile does not cover: one line, exit 2
            check_checkpoint(checkpoint, schema.model_profile_for(contract_id))
        except CheckpointError as exc:
            fail(f"error: {exc}")
        weights = str(checkpoint)
    try:
        if layouts is None:
            chosen = parse_layouts(DEFAULT_LAYOUTS)
            extra = parse_layouts("tp2pp2")[0]  # where the model allows it
            name = model_arch(contract_id, weights)[0].name
            if not layout_problems(contract_id, extra, name):
                chosen.append(extra)
        else:
            chosen = parse_layouts(layouts)
        config = GateConfig(contract_id, weights, chosen, None if dtype == "contract" else dtype,
                            device, inject_faults, not quiet)  # fmt: skip
        check_layouts(config)
    except LayoutError as exc:
        fail(f"error: {exc}")
    report = run_gate(config)
    click.echo(table(report))
    if json_path is not None:
        text = json.dumps(report, indent=2)
        if str(json_path) == "-":
            click.echo(text)
        else:
            json_path.write_text(text + "\n")
    sys.exit(EXIT_OK if passed(report) else EXIT_DRIFT)
