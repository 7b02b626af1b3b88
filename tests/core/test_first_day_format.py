"""Issue 55 item 8: byte-identical vendored copies that every repo's formatter leaves alone.

Each target's formatters are in contractgen.toml (miles: black 119 + isort; the fork: black 100,
no string normalization, no magic trailing comma); the files are rendered in the one form they
all keep, and the stamp hashes the bytes, so a comment or a blank line is drift again.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import black
import isort
import pytest

from contractgen.codegen.fingerprint import body_hash, read_stamp
from contractgen.codegen.formatters import FormatConflict, Formatter, common_form
from contractgen.project import open_project

from .helpers import PACKAGES, ROOT, cli, sibling_checkout

FORK = black.Mode(line_length=100, string_normalization=False, magic_trailing_comma=False)
MILES = black.Mode(line_length=119)
MILES_ISORT = isort.Config(
    profile="black", line_length=119, known_first_party=("miles", "miles_plugins")
)


@pytest.fixture(scope="module")
def vendored() -> dict[str, bytes]:
    return open_project(ROOT).vendored


def test_each_repos_black_and_isort_leave_the_vendored_files_unchanged(vendored) -> None:
    checked = 0
    for key, content in vendored.items():
        text = content.decode()
        target = key.split("/", 1)[0]
        if target == "megatron":
            assert black.format_str(text, mode=FORK) == text, key
        elif target in ("launcher", "fsdp"):
            assert black.format_str(text, mode=MILES) == text, key
            assert isort.code(text, config=MILES_ISORT) == text, key
        else:
            continue
        checked += 1
    assert checked >= 9


def test_schema_py_is_byte_identical_in_every_repo(vendored) -> None:
    copies = {k: v for k, v in vendored.items() if k.endswith("/schema.py")}
    assert len(copies) == 4 and len(set(copies.values())) == 1


def test_the_stamp_hashes_the_bytes(vendored) -> None:
    content = vendored[f"megatron/{PACKAGES['megatron']}/runtime_policy.py"]
    stamp = read_stamp(content)
    assert stamp is not None and stamp.kind == "sha256"
    assert stamp.recorded == hashlib.sha256(stamp.body).hexdigest()


def _synced(tmp_path: Path) -> tuple[Path, Path]:
    fork = sibling_checkout(tmp_path / "Megatron-LM", "megatron")
    miles = sibling_checkout(tmp_path / "miles", "launcher", "fsdp")
    result = cli(
        "--root", ROOT, "sync", "--repo", f"Megatron-LM={fork}", "--repo", f"miles={miles}"
    )
    assert result.exit_code == 0, result.output + result.stderr
    return fork, miles


def test_a_comment_or_a_blank_line_is_drift_and_sibling_drift(tmp_path: Path) -> None:
    fork, miles = _synced(tmp_path)
    args = ("--repo", f"Megatron-LM={fork}", "--repo", f"miles={miles}")
    assert cli("--root", ROOT, "check", *args).exit_code == 0
    schema = fork / PACKAGES["megatron"] / "schema.py"
    schema.write_bytes(schema.read_bytes() + b"\n# a note added by hand\n")
    result = cli("--root", ROOT, "check", *args)
    assert result.exit_code == 1
    assert f"stale: megatron:{fork.as_posix()}/{PACKAGES['megatron']}/schema.py" in result.output
    assert "sibling:" in result.output
    refused = cli("--root", ROOT, "sync", *args)
    assert refused.exit_code == 1 and "edited by hand" in refused.stderr


def test_a_format_2_copy_is_ours_but_stale_until_resynced(tmp_path: Path) -> None:
    fork, miles = _synced(tmp_path)
    policy = fork / PACKAGES["megatron"] / "runtime_policy.py"
    stamp = read_stamp(policy.read_bytes())
    assert stamp is not None
    head = policy.read_bytes()[: -len(stamp.body)].decode()
    head = head.replace("(format 3)", "(format 2)").replace(
        f"# sha256: {stamp.recorded}", f"# canonical-sha256: {body_hash(stamp.body)}"
    )
    policy.write_bytes(head.encode() + stamp.body)
    args = ("--repo", f"Megatron-LM={fork}")
    check = cli("--root", ROOT, "check", *args)
    assert check.exit_code == 1 and "stale:" in check.output
    synced = cli("--root", ROOT, "sync", *args)  # no --force: a format-2 file is contractgen's
    assert synced.exit_code == 0, synced.stderr
    assert "(format 3)" in policy.read_text()


def test_settings_that_admit_no_common_form_name_both_repos() -> None:
    source = (  # 111 characters: black at 100 splits it, black at 119 joins it back
        "if True:\n    value = some_function_name(argument_one) and another_function(argument_two)"
        " or third_call(argument_three_x)\n"
    )
    narrow = Formatter("megatron", "black", (("line-length", 100),))
    wide = Formatter("launcher", "black", (("line-length", 119),))
    with pytest.raises(FormatConflict) as info:
        common_form(source, (narrow, wide), "schema.py")
    assert "megatron's black" in str(info.value) and "launcher's black" in str(info.value)
