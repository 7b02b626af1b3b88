"""Without ``.venv-vllm`` the vLLM tests skip locally and fail on CI, naming the install command."""

from __future__ import annotations

import pytest
from vllm_case import require_vllm


@pytest.mark.parametrize(("ci", "outcome"), [("true", pytest.fail.Exception), ("", pytest.skip.Exception)])  # fmt: skip
def test_missing_vllm_env_fails_on_ci_and_skips_locally(monkeypatch, tmp_path, ci, outcome):
    monkeypatch.setenv("CONTRACTGEN_VLLM_PYTHON", str(tmp_path / "no-such-python"))
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match="bash tools/install-vllm.sh"):
        require_vllm()
