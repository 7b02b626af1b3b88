"""Import one version of a true-on-policy package and describe it, for ``adopt`` (stdlib only).

    python adopt_probe.py SPEC_JSON      (prints a JSON report)

SPEC: ``{"root": import root, "package": dotted name, "modules": [stems], "ids": [...]}``. The
package and its parents are made importable without running their ``__init__.py`` (SGLang's
imports torch), then each module is imported and described: every public name's kind and value,
each function's and method's parameters, each dataclass's fields, and the results of the public
functions and of the contract objects' methods over a probe grid (contract ids, TP / CP /
``cp_comm_type`` forms, batch-invariant mode, rollout TP, train backends, rollout targets, K
sizes). ``adopt`` runs it on the repo's hand-kept package and on the generated one and compares.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import itertools
import json
import sys
import types
from pathlib import Path
from types import SimpleNamespace

COMM_TYPES = (None, "a2a", "p2p", ["a2a"], ["a2a", "p2p"], ["p2p", "p2p"], ("a2a",))
K_SIZES = (19, 38, 64, 128, 2560, 4864, 9728)


def configs(contract: object = "<unset>") -> list[tuple[str, object]]:
    """(label, config) over the layout grid; ``contract`` sets ``true_on_policy_contract``."""
    out = []
    for tp, cp, comm, bim, rtp in itertools.product((1, 2), (1, 2), COMM_TYPES, (False, True),
                                                    (1, 2)):  # fmt: skip
        values = {"tensor_model_parallel_size": tp, "context_parallel_size": cp,
                  "cp_comm_type": comm, "batch_invariant_mode": bim, "tp_size": rtp}  # fmt: skip
        if contract != "<unset>":
            values["true_on_policy_contract"] = contract
        label = ", ".join(f"{k}={v!r}" for k, v in values.items())
        out.append((f"Config({label})", SimpleNamespace(**values)))
    return out


def show(value: object, depth: int = 0) -> str:
    """A full, deterministic text of a value (dataclasses field by field, never cut)."""
    if depth > 6:
        return "…"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        inner = ", ".join(
            f"{f.name}={show(getattr(value, f.name), depth + 1)}" for f in dataclasses.fields(value)
        )
        return f"{type(value).__name__}({inner})"
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda kv: repr(kv[0]))
        return "{" + ", ".join(f"{k!r}: {show(v, depth + 1)}" for k, v in items) + "}"
    if isinstance(value, (list, tuple)):
        body = ", ".join(show(v, depth + 1) for v in value)
        return (
            f"[{body}]" if isinstance(value, list) else f"({body}{',' if len(value) == 1 else ''})"
        )
    return repr(value)


def tree(value: object, depth: int = 0) -> object:
    """The value as JSON: a dataclass as its class name and fields (for field-wise comparison)."""
    if depth > 6:
        return "…"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"__class__": type(value).__name__,
                "fields": {f.name: tree(getattr(value, f.name), depth + 1)
                           for f in dataclasses.fields(value)}}  # fmt: skip
    if isinstance(value, (list, tuple)):
        return [tree(v, depth + 1) for v in value]
    if isinstance(value, dict):
        return {repr(k): tree(v, depth + 1) for k, v in value.items()}
    return repr(value)


def outcome(call) -> dict:
    try:
        value = call()
        return {"value": show(value), "tree": tree(value)}
    except Exception as exc:
        return {"raises": type(exc).__name__, "mro": [c.__name__ for c in type(exc).__mro__],
                "message": str(exc)}  # fmt: skip


def signature(fn: object) -> list[list[str]] | None:
    try:
        params = inspect.signature(fn).parameters.values()  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return [[p.name, p.kind.name, "<required>" if p.default is p.empty else repr(p.default)]
            for p in params]  # fmt: skip


def grid(spec: dict, params: list[list[str]]) -> list[tuple[str, tuple, dict]]:
    """(label, positional args, keyword args) for each probe of a callable with these
    parameters (keyword-only ones by name)."""
    ids = spec["ids"]
    axes = []
    keyword: list[str | None] = []
    for name, kind, default in params:
        keyword.append(name if kind == "KEYWORD_ONLY" else None)
        if name == "self" or kind in ("VAR_POSITIONAL", "VAR_KEYWORD"):
            continue
        if name in ("name", "contract_name", "contract_id"):
            axes.append([(repr(i), i) for i in ids])
        elif name in ("config", "server_args", "contract_name_or_config"):
            axes.append([(label, cfg) for c in (None, ids[0], "unknown_contract")
                         for label, cfg in configs(c)])  # fmt: skip
        elif name in ("k_size", "num_tiles", "k"):
            axes.append([(str(k), k) for k in K_SIZES])
        elif name == "train_backend":
            axes.append([(repr(b), b) for b in ("megatron", "fsdp")])
        elif name == "sglang_target":
            axes.append([(repr(t), t) for t in ("fsdp", "fsdp_tp")])
        elif default != "<required>":
            keyword.pop()
            break  # later parameters keep their defaults
        else:
            return []  # a required parameter the grid knows nothing about: not probed
    keyword = [k for k, (n, kind, _) in zip(keyword, params, strict=False) if n != "self"
               and kind not in ("VAR_POSITIONAL", "VAR_KEYWORD")][: len(axes)]  # fmt: skip
    out = []
    for combo in itertools.product(*axes):
        args = tuple(v for (_, v), k in zip(combo, keyword, strict=False) if k is None)
        kwargs = {k: v for (_, v), k in zip(combo, keyword, strict=False) if k is not None}
        label = ", ".join(
            lab if k is None else f"{k}={lab}" for (lab, _), k in zip(combo, keyword, strict=False)
        )
        out.append((label, args, kwargs))
    return out


def describe(spec: dict) -> dict:
    root, package = Path(spec["root"]), spec["package"]
    parts = package.split(".")
    for i in range(1, len(parts) + 1):  # the package and its parents, without their __init__
        name = ".".join(parts[:i])
        module = types.ModuleType(name)
        module.__path__ = [str(root.joinpath(*parts[:i]))]  # type: ignore[attr-defined]
        sys.modules[name] = module
    sys.path.insert(0, str(root))
    report: dict = {"modules": {}, "probes": {}, "errors": {}}
    own_classes: set[int] = set()
    loaded = {}
    for stem in spec["modules"]:
        try:
            loaded[stem] = importlib.import_module(f"{package}.{stem}")
        except Exception as exc:
            report["errors"][stem] = f"{type(exc).__name__}: {exc}"
    for module in loaded.values():
        own_classes |= {id(v) for v in vars(module).values() if isinstance(v, type)
                        and (v.__module__ or "").startswith(package)}  # fmt: skip
    for stem, module in loaded.items():
        names = {}
        for name in sorted(spec["names"].get(stem, [])):
            if not hasattr(module, name):
                continue
            value = getattr(module, name)
            entry: dict = {}
            if isinstance(value, type):
                entry["kind"] = "class"
                if dataclasses.is_dataclass(value):
                    entry["fields"] = [
                        [f.name, str(f.type),
                         "<required>" if f.default is dataclasses.MISSING
                         and f.default_factory is dataclasses.MISSING else repr(f.default)]
                        for f in dataclasses.fields(value)
                    ]  # fmt: skip
                entry["methods"] = {
                    m: signature(getattr(value, m)) for m, v in vars(value).items()
                    if not m.startswith("_") and callable(v)
                }  # fmt: skip
                entry["properties"] = sorted(
                    m for m, v in vars(value).items() if isinstance(v, property)
                )
                entry["bases"] = [b.__name__ for b in value.__mro__[1:]]
            elif callable(value) and not hasattr(value, "__origin__"):
                entry["kind"] = "function"
                entry["params"] = signature(value)
                for label, args, kw in grid(spec, entry["params"] or []):
                    report["probes"][f"{name}({label})"] = outcome(
                        lambda v=value, a=args, k=kw: v(*a, **k)
                    )
            else:
                entry["kind"] = "value"
                entry["value"] = show(value)
                entry["tree"] = tree(value)
                if hasattr(value, "__origin__") and getattr(value, "__args__", None):
                    entry["literal"] = sorted(map(repr, value.__args__))
                if id(type(value)) in own_classes:  # a contract object: probe its methods
                    for attr in sorted(dir(type(value))):
                        member = getattr(type(value), attr)
                        if attr.startswith("_"):
                            continue
                        if isinstance(member, property):
                            report["probes"][f"{name}.{attr}"] = outcome(
                                lambda v=value, a=attr: getattr(v, a)
                            )
                        elif callable(member):
                            bound = getattr(value, attr)
                            for label, args, kw in grid(spec, signature(bound) or []):
                                report["probes"][f"{name}.{attr}({label})"] = outcome(
                                    lambda b=bound, a=args, k=kw: b(*a, **k)
                                )
            names[name] = entry
        report["modules"][stem] = names
    return report


if __name__ == "__main__":
    print(json.dumps(describe(json.loads(sys.argv[1]))))
