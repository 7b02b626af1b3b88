"""Fixtures for the core tests (helpers live in ``helpers.py``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from .helpers import make_project


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of the shipped contracts in a fresh project folder (no generated/ yet)."""
    return make_project(tmp_path / "project")


@pytest.fixture
def render_project() -> Callable[[Path], dict[str, bytes]]:
    def _render(root: Path) -> dict[str, bytes]:
        from contractgen.project import open_project

        return open_project(root).rendered

    return _render
