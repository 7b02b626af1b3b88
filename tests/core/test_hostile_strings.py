"""Contract text can only ever be data: hostile strings round-trip exactly and never change the
meaning (or the formatting) of generated code."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contractgen.codegen.config import load_config
from contractgen.codegen.literals import py_literal, py_str
from contractgen.codegen.render import render
from contractgen.schema.loader import LoadedContract, parse_contract

from .helpers import PACKAGES, ROOT, V1_ID, V1_YAML, load_rendered_package

HOSTILE = [
    "a \"double\" and 'single' quote",
    '"""triple double"""',
    "'''triple single'''",
    '""" + __import__("os").system("echo pwned") + """',
    "back\\slash \\n \\x00 \\u2028 trailing\\",
    "new\nline\r\ncarriage\rreturn\ttab",
    "# not a comment\n# still not",
    "\u2028line separator\u2029paragraph separator\x85next line\x0bvt\x0cff\x1cfs",
    "nul\x00bel\x07esc\x1bdel\x7f",
    "emoji 😀🚀👩‍👩‍👧 and BOM \ufeff zero-width \u200b RTL \u202e override",
    "é ü 中文 العربية ✓",
    "{{ jinja }} {% raw %}{# comment #} ${shell} `cmd`",
    "\\",
    "'",
    '"',
    "\x85",
    "x" * 500,
]

_V1_DATA = yaml.safe_load(V1_YAML.read_text())


def _contract_yaml(description: str, checkpoint_name: str) -> bytes:
    data = yaml.safe_load(V1_YAML.read_text())
    data["description"] = description
    data["model_profile"]["checkpoints"][0]["name"] = checkpoint_name
    data["model_profile"]["reference_model"]["name"] = checkpoint_name
    # allow_unicode=False: PyYAML escapes every non-ASCII character. With allow_unicode=True it
    # writes U+0085 raw, which YAML reads as a line break (folded to a space): the test input
    # would not hold the string under test.
    text = yaml.safe_dump(data, allow_unicode=False, sort_keys=False)
    assert yaml.safe_load(text)["description"] == description
    return text.encode("utf-8")


def _render(source: bytes) -> tuple[dict[str, bytes], LoadedContract]:
    contract = parse_contract(source, f"contracts/{V1_ID}.yaml")
    loaded = LoadedContract(contract, ROOT / "contracts" / f"{V1_ID}.yaml", source)
    return render([loaded], load_config(ROOT)), loaded


def _shape(source: bytes) -> list[str]:
    """The AST with every constant's value blanked: what the code *does*, not the data it holds."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant):
            out.append(f"Constant:{type(node.value).__name__}")
        elif isinstance(node, ast.Name | ast.Attribute | ast.arg | ast.keyword):
            out.append(
                f"{type(node).__name__}:{getattr(node, 'id', '') or getattr(node, 'attr', '') or getattr(node, 'arg', '')}"
            )
        else:
            out.append(type(node).__name__)
    return out


BASELINE, _ = _render(_contract_yaml("plain", "plain"))
BASELINE_SHAPES = {path: _shape(content) for path, content in BASELINE.items()}


def _check(description: str, name: str) -> dict[str, bytes]:
    rendered, loaded = _render(_contract_yaml(description, name))
    assert loaded.contract.description == description
    assert loaded.contract.model_profile.checkpoints[0].name == name
    for target in PACKAGES:
        base = f"{target}/{PACKAGES[target]}"
        files = {f: rendered[f"{base}/{f}"] for f in ("schema.py", "runtime_policy.py")}
        schema, rp = load_rendered_package(files, f"_cg_hostile_{target}")
        assert schema.CONTRACT_DATA[V1_ID] == loaded.contract.model_dump(mode="json")
        assert schema.model_profile_for(V1_ID).checkpoints[0].name == name
        assert schema.verify_fingerprints() == []
        assert rp.policy_for(V1_ID).contract_name == V1_ID
    for path, content in rendered.items():
        if path.startswith("sglang/"):  # the other targets' files hold the same text
            assert _shape(content) == BASELINE_SHAPES[path], f"{path}: code shape changed"
    return rendered


@pytest.mark.parametrize("text", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_fixed_cases_round_trip(text: str) -> None:
    _check(text, text[:120])  # checkpoint names are at most 120 characters


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=60),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=30),
)
def test_hostile_text_property(description: str, name: str) -> None:
    _check(description, name)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",))))
def test_py_str_is_exact_and_one_token(text: str) -> None:
    literal = py_str(text)
    tree = ast.parse(literal, mode="eval")
    assert isinstance(tree.body, ast.Constant) and tree.body.value == text
    assert "\n" not in literal and "\r" not in literal
    assert all(ch.isprintable() and ch not in "\u2028\u2029\ufeff" for ch in literal)


def test_py_literal_rejects_non_json_values() -> None:
    for bad in (float("nan"), float("inf"), b"bytes", {1: "int key"}, object()):
        with pytest.raises((TypeError, ValueError)):
            py_literal(bad)


def test_hostile_output_passes_ruff_format_and_check(tmp_path: Path) -> None:
    """Output holding every hostile string is still formatted as the pinned ruff wants it."""
    for i, text in enumerate(HOSTILE):
        rendered = _check(text, text[:120])
        for path, content in rendered.items():
            if path.startswith("sglang/") or path.endswith("schema.py"):
                dest = tmp_path / f"case{i}" / path
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(content)
    ruff = str(Path(sys.executable).with_name("ruff"))
    config = ["--config", str(ROOT / "pyproject.toml"), "--no-cache"]
    fmt = subprocess.run(
        [ruff, "format", "--check", *config, str(tmp_path)], capture_output=True, text=True
    )
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr
    check = subprocess.run([ruff, "check", *config, str(tmp_path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_hostile_text_cannot_reach_comments_or_docstrings() -> None:
    """Contract text appears only inside string constants of CONTRACT_DATA, never in the header,
    a comment or a docstring."""
    marker = "ZZ_HOSTILE_MARKER # \"\"\" '''"
    rendered, _ = _render(_contract_yaml(marker, "ZZ_HOSTILE_MARKER"))
    for path, content in rendered.items():
        text = content.decode()
        for line in text.splitlines():
            if "ZZ_HOSTILE_MARKER" in line:
                assert line.lstrip().startswith('"') or line.lstrip().startswith("'"), (path, line)
                assert not line.lstrip().startswith("#"), (path, line)
