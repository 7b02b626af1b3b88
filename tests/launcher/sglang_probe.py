"""Run in a subprocess by the tests: parse argument lists with the real sglang release's parser.

Isolated because importing sglang patches transformers and wants triton; neither must leak into
the other tests. stdin: {"arg_lists": [[...], ...], "flags": [...]}; stdout: JSON with, per
flag, whether the parser knows it (and its dest), and per argument list, the parsed values of the
dests it set or the parser's error.
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import importlib.util
import json
import sys
import types
from typing import Any


class _Anything:
    """Stands in for any triton attribute: callable, subscriptable, usable as a decorator."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return self

    def __getattr__(self, name: str) -> Any:
        return self

    def __getitem__(self, key: Any) -> Any:
        return self

    def __mro_entries__(self, bases: tuple) -> tuple:
        return (object,)


def _stub_attribute(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    return _Anything()


class _TritonStub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """sglang imports triton at module level (sglang.srt.utils.common); the argument parser never
    calls it. Without triton installed (1 GB, a GPU compiler) this stub is enough on CPU."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name.split(".")[0] == "triton":
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        module.__path__ = []  # type: ignore[attr-defined]
        module.__getattr__ = _stub_attribute  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def _parser(prefix: str = "") -> argparse.ArgumentParser:
    """SGLang's server parser; with ``prefix`` (``"sglang-"``), every option registered under
    ``--{prefix}`` and every dest under ``{prefix}`` with ``_`` for ``-``: how a launcher that
    starts SGLang itself (miles' ``train.py``) takes the same arguments."""
    if importlib.util.find_spec("triton") is None:
        sys.meta_path.insert(0, _TritonStub())
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(exit_on_error=False)
    if prefix:
        register = parser.add_argument
        dest_prefix = prefix.replace("-", "_")

        def prefixed(*names, **kwargs):
            longs = [n for n in names if n.startswith("--")]
            if "dest" not in kwargs and longs:
                kwargs["dest"] = longs[0][2:].replace("-", "_")
            if "dest" in kwargs:
                kwargs["dest"] = dest_prefix + kwargs["dest"]
            return register(*[f"--{prefix}{n.lstrip('-')}" for n in names], **kwargs)

        parser.add_argument = prefixed
    ServerArgs.add_cli_args(parser)
    return parser


def main() -> None:
    request = json.load(sys.stdin)
    parser = _parser(request.get("prefix", ""))
    actions = parser._option_string_actions
    flags = {
        flag: {"known": flag in actions, "dest": actions[flag].dest if flag in actions else None}
        for flag in request["flags"]
    }
    defaults = vars(parser.parse_args([f"--{request.get('prefix', '')}model-path", "x"]))
    parsed = []
    for args in request["arg_lists"]:
        try:
            namespace, unknown = parser.parse_known_args(args)
        except (argparse.ArgumentError, SystemExit) as exc:
            parsed.append({"error": str(exc)})
            continue
        values = vars(namespace)
        changed = {k: v for k, v in values.items() if v != defaults.get(k)}
        parsed.append({"set": json.loads(json.dumps(changed, default=str)), "unknown": unknown})
    import sglang

    print(json.dumps({"version": sglang.__version__, "flags": flags, "parsed": parsed}))


if __name__ == "__main__":
    main()
