"""Supersession links: a known target, at most one successor, no follow-on noise."""

from __future__ import annotations

from .helpers import ROOT, cli, files_under, make_project

V1 = "qwen3_dense_true_on_policy_v1"
V2 = "qwen3_dense_true_on_policy_v2"


def _write_v3(project, supersedes: str) -> None:
    text = (ROOT / "contracts" / f"{V2}.yaml").read_text()
    text = text.replace(f"id: {V2}", "id: qwen3_dense_true_on_policy_v3")
    text = text.replace(f"supersedes: {V1}", f"supersedes: {supersedes}")
    (project / "contracts" / "qwen3_dense_true_on_policy_v3.yaml").write_text(text)


def test_a_contract_superseded_twice_is_refused(tmp_path):
    project = make_project(tmp_path)
    _write_v3(project, V1)  # v2 already supersedes v1
    before = files_under(project)
    result = cli("--root", project, "generate")
    assert result.exit_code == 2
    assert (
        "contracts/qwen3_dense_true_on_policy_v3.yaml:13:1: supersedes: "
        f"'{V1}' is already superseded by '{V2}'" in result.output
    )
    assert files_under(project) == before


def test_superseding_the_newest_version_is_fine(tmp_path):
    project = make_project(tmp_path)
    _write_v3(project, V2)
    assert cli("--root", project, "generate").exit_code == 0
