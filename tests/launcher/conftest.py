"""Fixtures for the launcher tests."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from collections.abc import Callable
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest

from contractgen.codegen.vendored import load_target

HERE = Path(__file__).parent


@pytest.fixture(scope="session")
def schema() -> types.ModuleType:
    return load_target("launcher").schema


@pytest.fixture(scope="session")
def sglang_probe() -> Callable[..., dict[str, Any]]:
    """Parse argument lists with the real sglang release's parser, in a subprocess."""
    if find_spec("sglang") is None:
        pytest.skip(
            "sglang is not installed: pip install -e '.[sglang-args]' && pip install --no-deps sglang==0.5.23"
        )

    def probe(arg_lists: list[list[str]], flags: list[str], prefix: str = "") -> dict[str, Any]:
        request = json.dumps({"arg_lists": arg_lists, "flags": flags, "prefix": prefix})
        done = subprocess.run(
            [sys.executable, str(HERE / "sglang_probe.py")],
            input=request, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, (
            "sglang is installed but its argument parser could not be built; the light modules "
            "sglang.srt.server_args imports come from the sglang-args extra (orjson psutil "
            "pybase64 requests pillow starlette msgspec pyzmq IPython aiohttp):\n"
            + done.stderr[-3000:]
        )
        return json.loads(done.stdout.strip().splitlines()[-1])

    return probe
