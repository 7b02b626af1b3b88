"""Fuzz contract files: every input either validates and renders importable code, or the CLI
exits 2 with ``file:line:col`` lines. Never a traceback, never a partial write."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contractgen.project import open_project

from .helpers import PACKAGES, V1_ID, V1_YAML, cli, load_rendered_package

V1_TEXT = V1_YAML.read_bytes()
V1_DATA = yaml.safe_load(V1_TEXT)
PROBLEM = re.compile(r"^contracts/[^:]+\.yaml:\d+:\d+: \S.*$")
FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def _paths(node: object, here: tuple = ()) -> list[tuple]:
    out = [here]
    if isinstance(node, dict):
        for key, value in node.items():
            out += _paths(value, here + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out += _paths(value, here + (i,))
    return out


ALL_PATHS = _paths(V1_DATA)[1:]

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from(
        ["bfloat16", "float32", "rollout_tp", "ulysses_cp", "fixed_tree", "binary", "1", ""]
    )
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


@st.composite
def mutated_data(draw) -> bytes:
    data = yaml.safe_load(V1_TEXT)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(ALL_PATHS))
        parent = data
        try:
            for part in path[:-1]:
                parent = parent[part]
        except (KeyError, IndexError, TypeError):
            continue
        last = path[-1]
        op = draw(st.sampled_from(["delete", "replace", "insert"]))
        if isinstance(parent, dict) and last in parent:
            if op == "delete":
                del parent[last]
            elif op == "replace":
                parent[last] = draw(values)
            else:
                parent[draw(st.text(min_size=1, max_size=10))] = draw(values)
        elif isinstance(parent, list) and isinstance(last, int) and last < len(parent):
            if op == "delete":
                del parent[last]
            elif op == "replace":
                parent[last] = draw(values)
            else:
                parent.insert(last, draw(values))
    return yaml.safe_dump(data, allow_unicode=True, sort_keys=draw(st.booleans())).encode()


@st.composite
def mutated_bytes(draw) -> bytes:
    text = bytearray(V1_TEXT)
    for _ in range(draw(st.integers(1, 4))):
        pos = draw(st.integers(0, len(text)))
        op = draw(st.sampled_from(["insert", "delete", "replace"]))
        chunk = draw(
            st.binary(min_size=1, max_size=4)
            | st.sampled_from(
                [
                    b":",
                    b"-",
                    b"[",
                    b"{",
                    b"&a",
                    b"*a",
                    b"!!python/object",
                    b"\t",
                    b"\n  ",
                    b'"',
                    b"#",
                    b"\xff",
                ]
            )
        )
        if op == "insert":
            text[pos:pos] = chunk
        elif op == "delete":
            del text[pos : pos + len(chunk)]
        else:
            text[pos : pos + len(chunk)] = chunk
    return bytes(text)


def _run(source: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "contractgen.toml").write_text("")
        (root / "contracts").mkdir()
        (root / "contracts" / f"{V1_ID}.yaml").write_bytes(source)
        # `check` validates and renders exactly like `generate` without the fsync'd writes; a valid
        # contract exits 1 here (generated/ is missing). Golden error cases pin that a rejected
        # `generate` writes nothing.
        result = cli("--root", root, "check")
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise AssertionError(f"traceback for input {source!r}") from result.exception
        if result.exit_code == 1:
            assert "missing: generated/" in result.output
            rendered = open_project(root).rendered
            for target, package in PACKAGES.items():
                prefix = f"{target}/{package}/"
                files = {k[len(prefix) :]: v for k, v in rendered.items() if k.startswith(prefix)}
                schema, policy = load_rendered_package(files, f"_cg_fuzz_{target}")
                assert schema.verify_fingerprints() == []
                for cid in schema.CONTRACT_IDS:
                    policy.policy_for(cid)
                    schema.kernel_policy_for(cid)
                    schema.model_profile_for(cid)
            return
        assert result.exit_code == 2, (result.exit_code, result.output, source)
        assert result.stdout == ""
        lines = result.stderr.splitlines()
        assert lines, source
        for line in lines:
            assert PROBLEM.match(line), f"not a located problem line: {line!r}"


@FUZZ
@given(mutated_data())
def test_fuzz_structured_mutations(source: bytes) -> None:
    _run(source)


@FUZZ
@given(mutated_bytes())
def test_fuzz_byte_mutations(source: bytes) -> None:
    _run(source)


@settings(max_examples=20, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_random_bytes(source: bytes) -> None:
    _run(source)


def test_unmodified_contract_generates() -> None:
    _run(V1_TEXT)


def test_known_nasty_inputs() -> None:
    for source in [
        b"",
        b"\x00",
        b"- 1\n- 2\n",
        b"a: &a [*a]\n",
        b"[" * 3000,
        b"a: !!python/object/apply:os.system ['echo pwned']\n",
        b"a: !!binary aGVsbG8=\n",
        b"a: .nan\n",
        b"? [a, b]\n: c\n",
        b"\xef\xbb\xbfschema_version: 1\n",
        b"schema_version: 1\nschema_version: 1\n",
        V1_TEXT.replace(b"matmul_k_block: 128", b"matmul_k_block: 1e400"),
        V1_TEXT.replace(b"matmul_k_block: 128", b"matmul_k_block: 99999999999999999999999"),
        V1_TEXT.replace(b"id: qwen3_dense_true_on_policy_v1", b"id: 2026-11-30"),
    ]:
        _run(source)
