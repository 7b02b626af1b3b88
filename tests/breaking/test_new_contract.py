"""``contractgen new``: the next version is the old file with ``id`` and ``supersedes`` edited,
comments kept, validated; refusals write nothing. And the generated ``schema.py`` names the
newer contract (``SUPERSEDED_BY``, ``newer_contract``)."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest
from breaking_support import (
    HERE,
    V1,
    V2,
    check_golden,
    cli,
    copy_fixture,
    make_repo,
    transcript,
)

from contractgen.codegen.scaffold import scaffold
from contractgen.codegen.vendored import load_target
from contractgen.schema.errors import ContractError
from contractgen.schema.loader import parse_contract

V1_ID, V2_ID, V3_ID = (f"qwen3_dense_true_on_policy_v{n}" for n in (1, 2, 3))
V3 = f"contracts/{V3_ID}.yaml"
GOLDENS = HERE / "new"


def _listing(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "contracts").iterdir())


def test_new_copies_the_file_with_id_and_supersedes(tmp_path: Path) -> None:
    root = copy_fixture(tmp_path / "project")
    check_golden(GOLDENS / "new.txt", transcript(root, ["new", "--from", V2_ID, "--id", V3_ID]))
    old = (root / V2).read_text()
    expected = old.replace(f"id: {V2_ID}", f"id: {V3_ID}").replace(
        f"supersedes: {V1_ID}", f"supersedes: {V2_ID}"
    )
    assert (root / V3).read_text() == expected  # every comment and line break kept
    contract = parse_contract((root / V3).read_bytes(), V3)
    assert (contract.id, contract.supersedes) == (V3_ID, V2_ID)


def test_new_replaces_a_null_supersedes_and_keeps_comments(tmp_path: Path) -> None:
    root = copy_fixture(tmp_path / "project")
    (root / V2).unlink()
    code, _, err = cli(root, "new", "--from", V1_ID)  # --id defaults to the next version
    assert code == 0, err
    old, new = (root / V1).read_text(), (root / V2).read_text()
    assert new == old.replace(f"id: {V1_ID}", f"id: {V2_ID}").replace(
        "supersedes: null", f"supersedes: {V1_ID}"
    )
    assert "# intermediate 9728 = 76 tiles" in new


def test_new_inserts_supersedes_when_absent(tmp_path: Path) -> None:
    root = copy_fixture(tmp_path / "project")
    (root / V2).unlink()
    text = (root / V1).read_text()
    (root / V1).write_text(text.replace("supersedes: null\n", ""))
    code, _, err = cli(root, "new", "--from", V1_ID, "--id", "qwen3_dense_true_on_policy_v7")
    assert code == 0, err
    new = (root / "contracts/qwen3_dense_true_on_policy_v7.yaml").read_text()
    assert f"id: qwen3_dense_true_on_policy_v7\nsupersedes: {V1_ID}\nfamily:" in new


def test_new_line_supersedes_nothing(tmp_path: Path) -> None:
    """Another name is a new line (e.g. a new architecture from the closest contract)."""
    root = copy_fixture(tmp_path / "project")
    new_id = "llama3_dense_true_on_policy_v1"
    check_golden(
        GOLDENS / "new-line.txt", transcript(root, ["new", "--from", V1_ID, "--id", new_id])
    )
    new = (root / f"contracts/{new_id}.yaml").read_text()
    assert new == (root / V1).read_text().replace(f"id: {V1_ID}", f"id: {new_id}")
    assert cli(root, "list")[0] == 0


def test_scaffold_fills_an_empty_supersedes() -> None:
    source = (HERE / "fixture" / V1).read_bytes().replace(b"supersedes: null", b"supersedes:")
    out = scaffold(source, V2_ID, V1_ID, "x.yaml")
    assert b"supersedes: qwen3_dense_true_on_policy_v1\n" in out


def test_scaffold_result_is_validated() -> None:
    with pytest.raises(ContractError, match="id: string should match pattern"):
        scaffold((HERE / "fixture" / V1).read_bytes(), "Not-An-Id_v2", V1_ID, "x.yaml")


def test_dry_run_prints_and_writes_nothing(tmp_path: Path) -> None:
    root = copy_fixture(tmp_path / "project")
    before = _listing(root)
    code, out, _ = cli(root, "new", "--from", V2_ID, "--dry-run")
    assert code == 0 and f"id: {V3_ID}\n" in out and f"supersedes: {V2_ID}\n" in out
    assert _listing(root) == before


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("exists", ["--from", V2_ID, "--id", V1_ID]),
        ("bad-id", ["--from", V2_ID, "--id", "Qwen3-v3"]),
        ("no-version", ["--from", V2_ID, "--id", "qwen3_dense_next"]),
        ("superseded", ["--from", V1_ID, "--id", V3_ID]),
        ("older-version", ["--from", V2_ID, "--id", "qwen3_dense_true_on_policy_v0"]),
        ("unknown-from", ["--from", "qwen3_dense_true_on_policy_v9"]),
    ],
)
def test_new_refuses(tmp_path: Path, name: str, args: list[str]) -> None:
    root = copy_fixture(tmp_path / "project")
    before = _listing(root)
    check_golden(GOLDENS / f"new-refuses-{name}.txt", transcript(root, ["new", *args]))
    assert _listing(root) == before


def _import_generated_schema(path: Path) -> types.ModuleType:
    name = f"_generated_schema_{abs(hash(path))}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    return module


def test_workflow_new_generate_breaking_check(tmp_path: Path) -> None:
    """README's workflow: new → edit → generate → breaking clean → check; schema.py names v3."""
    root = make_repo(tmp_path / "project")
    assert cli(root, "new", "--from", V2_ID)[0] == 0
    text = (root / V3).read_text().replace("attention_kv_chunk: 64", "attention_kv_chunk: 128")
    (root / V3).write_text(text)
    code, out, err = cli(root, "generate")
    assert code == 0, err
    code, out, err = cli(root, "breaking", "--against", "main")
    assert code == 0, out + err
    assert cli(root, "check")[0] == 0
    for target in ("launcher", "megatron", "sglang"):
        schema_py = next((root / "generated" / target).rglob("schema.py"))
        schema = _import_generated_schema(schema_py)
        assert schema.SUPERSEDED_BY == {V1_ID: V2_ID, V2_ID: V3_ID}
        assert schema.newer_contract(V1_ID) == V3_ID
        assert schema.newer_contract(V2_ID) == V3_ID
        assert schema.newer_contract(V3_ID) is None


def test_shipped_schema_names_the_newer_contract() -> None:
    """The project's own generated schema.py: a launcher can name v2 when refusing v1."""
    schema = load_target("launcher").schema
    assert schema.SUPERSEDED_BY[V1_ID] == V2_ID
    assert schema.newer_contract(V1_ID) == (schema.newer_contract(V2_ID) or V2_ID)
