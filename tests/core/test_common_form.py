"""Contract data of any length has one form that every repo's formatters keep: miles' black at
119 joins what fits in 119 columns, the fork's black at 100 without magic trailing commas hugs
what does not fit in 100, so a collection between the two needs the literal's hold comment
(``literals.JOIN_WINDOW``) or the two keep undoing each other (``FormatConflict``)."""

from __future__ import annotations

import random
import string

import pytest

from contractgen.codegen.formatters import Formatter, _common_form
from contractgen.codegen.literals import py_literal

SCHEMA_FORMATTERS = (
    Formatter("launcher", "black", (("line-length", 119),)),
    Formatter("launcher", "isort", (("line-length", 119), ("profile", "black"))),
    Formatter(
        "megatron",
        "black",
        (
            ("line-length", 100),
            ("skip-magic-trailing-comma", True),
            ("skip-string-normalization", True),
        ),
    ),  # fmt: skip
)


def _text(rng: random.Random, most: int) -> str:
    return "".join(rng.choice(string.ascii_lowercase + "_. ") for _ in range(rng.randint(1, most)))


def _data(rng: random.Random, depth: int = 0) -> object:
    kind = rng.random()
    if depth >= 3 or kind < 0.4:
        return rng.choice([_text(rng, 70), rng.randint(0, 10**6), True, None, 0.5])
    if kind < 0.6:
        return [_data(rng, depth + 1) for _ in range(rng.randint(1, 4))]
    return {_text(rng, 50): _data(rng, depth + 1) for _ in range(rng.randint(1, 4))}


@pytest.mark.parametrize("seed", range(60))
def test_any_contract_data_has_a_form_every_repo_keeps(seed: int) -> None:
    rng = random.Random(seed)
    data = {_text(rng, 40): _data(rng) for _ in range(rng.randint(1, 5))}
    source = f"CONTRACT_DATA = {py_literal(data)}\n"
    _common_form(source, SCHEMA_FORMATTERS, "schema.py")  # FormatConflict if there is none


def test_without_the_hold_comment_such_data_has_no_common_form() -> None:
    """The test above can fail: the collection that needs the hold, written without it."""
    from contractgen.codegen.formatters import FormatConflict

    key = "runtime_policy.megatron.defer_ulysses_cp_loss_scaling_to_grad_sum"
    held = py_literal({"unobservable": {key: "gradients only"}}, 2, 8)
    assert "# one item a line" in held
    bare = held.replace("# one item a line\n", "").replace("    \n", "")
    source = f"class C:\n    def f(self):\n        return {bare}\n"
    assert "# one item a line" not in source
    with pytest.raises(FormatConflict):
        _common_form(source, SCHEMA_FORMATTERS, "schema.py")


@pytest.mark.parametrize("id_length", [17])  # 5..60 swept by hand, 2026-12-08
def test_a_one_contract_project_renders_whatever_its_ids_length(tmp_path, id_length: int) -> None:
    """A project of one contract, its id 14..22 long: the ``_SCHEMAS`` table of one entry then
    joins onto 101..119 columns, a form black at 119 keeps and black at 100 splits, unless the
    template holds it (``my_llama_dense_v1``, 17 long, had no form: generate exited 2)."""
    from pathlib import Path

    from contractgen.codegen.config import load_config
    from contractgen.codegen.render import render
    from contractgen.schema.loader import load_contracts

    new_id = ("c" * id_length)[: id_length - 3] + "_v1"
    shipped = Path(__file__).parents[2] / "contracts" / "llama3_dense_true_on_policy_v1.yaml"
    (tmp_path / "contracts").mkdir()
    text = shipped.read_text().replace("id: llama3_dense_true_on_policy_v1", f"id: {new_id}")
    (tmp_path / "contracts" / f"{new_id}.yaml").write_text(text)
    (tmp_path / "contractgen.toml").write_text("")
    files = render(load_contracts(tmp_path / "contracts", tmp_path), load_config(tmp_path))
    schema = next(body for path, body in files.items() if path.endswith("/schema.py"))
    const = new_id.upper()
    assert f"    # one item a line\n    {const}_SCHEMA.name: {const}_SCHEMA".encode() in schema
