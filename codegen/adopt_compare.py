"""How two probe reports of ``adopt`` differ: parameters, dataclass fields, values and errors.

Each function returns ``(detail, refuse)`` pairs: ``refuse`` is the flag that allows a breaking
difference (``--allow-drop`` / ``--allow-change``), or "" when the difference is compatible.
"""

from __future__ import annotations


def params_changes(name: str, old: list, new: list) -> list[tuple[str, str]]:
    """(detail, refuse) for each parameter difference of one callable."""
    out: list[tuple[str, str]] = []
    old_p = [p for p in old if p[0] != "self"]
    new_p = [p for p in new if p[0] != "self"]
    new_by_name = {p[0]: p for p in new_p}
    for i, (pname, kind, default) in enumerate(old_p):
        if pname in new_by_name:
            _, nkind, ndefault = new_by_name[pname]
            if nkind != kind:
                breaks = kind == "POSITIONAL_OR_KEYWORD" and nkind != "POSITIONAL_OR_KEYWORD"
                out.append((f"parameter {pname}: {kind.lower()} -> {nkind.lower()}",
                            "--allow-change" if breaks else ""))  # fmt: skip
            if ndefault != default:
                removed = ndefault == "<required>"
                changed = default != "<required>" and not removed
                out.append((f"parameter {pname}: default {default} -> {ndefault}",
                            "--allow-change" if removed or changed else ""))  # fmt: skip
            continue
        at = new_p[i] if i < len(new_p) else None
        if at is not None and at[0] not in {p[0] for p in old_p}:
            out.append((f"parameter {pname} renamed {at[0]} (a call {name}({pname}=…) raises "
                        "TypeError)", "--allow-change"))  # fmt: skip
        else:
            out.append((f"parameter {pname} removed", "--allow-drop"))
    old_names = {p[0] for p in old_p}
    for j, (pname, kind, default) in enumerate(new_p):
        if pname in old_names or (j < len(old_p) and old_p[j][0] not in new_by_name):
            continue
        out.append((f"parameter {pname} added ({kind.lower()}, default {default})",
                    "--allow-change" if default == "<required>" else ""))  # fmt: skip
    return out


def fields_changes(old: list, new: list) -> list[tuple[str, str, str]]:
    """(field, detail, refuse) for each dataclass field difference."""
    out = []
    old_names, new_names = [f[0] for f in old], [f[0] for f in new]
    new_by = {f[0]: f for f in new}
    for fname, ftype, default in old:
        if fname not in new_by:
            out.append((fname, f"field {fname}: {ftype} (default {default}) removed",
                        "--allow-drop"))  # fmt: skip
        elif new_by[fname][2] != default:
            out.append((fname, f"field {fname}: default {default} -> {new_by[fname][2]}",
                        "--allow-change"))  # fmt: skip
    for fname, ftype, default in new:
        if fname not in old_names:
            out.append((fname, f"field {fname}: {ftype} = {default} added",
                        "--allow-change" if default == "<required>" else ""))  # fmt: skip
    common_old = [n for n in old_names if n in new_by]
    common_new = [n for n in new_names if n in old_names]
    if common_old != common_new:
        out.append(("", f"fields reordered: {', '.join(common_old)} -> {', '.join(common_new)}",
                    "--allow-change"))  # fmt: skip
    return out


def outcome_text(o: dict) -> str:
    if "value" in o:
        return o["value"]
    return f"raises {o['raises']}: {o['message']}"


def compare_outcomes(key: str, old: dict, new: dict) -> tuple[str, str] | None:
    """(detail, refuse) when a probe's outcome differs; None when equal."""
    if old == new:
        return None
    if "value" in old and "value" in new:
        return value_change(old, new)
    if "raises" in old and "raises" in new and old["message"] == new["message"]:
        if old["raises"] in new["mro"]:
            return (f"error type {old['raises']} -> {new['raises']} (a subclass: `except "
                    f"{old['raises']}` still catches it)", "")  # fmt: skip
        return f"error type {old['raises']} -> {new['raises']}", "--allow-change"
    if "raises" in old and "raises" in new:
        return "error message changed", "--allow-change"
    return "value changed", "--allow-change"


def gained_fields(old: object, new: object, path: str = "") -> list[str] | None:
    """Fields ``new`` adds to ``old`` (dotted paths) when every old value is kept; None when some
    old value differs."""
    if isinstance(old, dict) and isinstance(new, dict) and "__class__" in old:
        if old.get("__class__") != new.get("__class__"):
            return None
        found: list[str] = []
        for key, value in old["fields"].items():
            if key not in new["fields"]:
                return None
            sub = gained_fields(value, new["fields"][key], f"{path}{key}.")
            if sub is None:
                return None
            found += sub
        found += [f"{path}{k}={v}" for k, v in new["fields"].items() if k not in old["fields"]]
        return found
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        found = []
        for a, b in zip(old, new, strict=False):
            sub = gained_fields(a, b, path)
            if sub is None:
                return None
            found += sub
        return found
    return [] if old == new else None


def value_change(old: dict, new: dict) -> tuple[str, str] | None:
    if old.get("value") == new.get("value"):
        return None
    gained = gained_fields(old.get("tree"), new.get("tree"))
    if gained:
        return f"same values, gains fields {', '.join(gained)}", ""
    if "literal" in old and "literal" in new:
        gained = sorted(set(new["literal"]) - set(old["literal"]))
        lost = sorted(set(old["literal"]) - set(new["literal"]))
        if not lost:
            return f"Literal widened by {', '.join(gained)}", ""
        return f"Literal loses {', '.join(lost)}", "--allow-change"
    ov, nv = old.get("value", ""), new.get("value", "")
    if nv.startswith(ov[:-1].split("(", 1)[0] + "(") and ov.endswith(")"):
        # a dataclass instance: the same values in the old fields, plus new ones, is a widening
        old_fields = split_fields(ov)
        new_fields = split_fields(nv)
        if (
            old_fields is not None
            and new_fields is not None
            and all(new_fields.get(k) == v for k, v in old_fields.items())
        ):
            extra = [f"{k}={v}" for k, v in new_fields.items() if k not in old_fields]
            return f"same values, gains fields {', '.join(extra)}", ""
    return "value changed", "--allow-change"


def split_fields(text: str) -> dict[str, str] | None:
    """``Cls(a=1, b=X(c=2))`` -> {"a": "1", "b": "X(c=2)"} (top-level fields only)."""
    if "(" not in text or not text.endswith(")"):
        return None
    body, out, depth, current = text[text.index("(") + 1 : -1], {}, 0, ""
    quote = ""
    for ch in body + ",":
        if quote:
            current += ch
            quote = "" if ch == quote else quote
            continue
        if ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            key, sep, value = current.strip().partition("=")
            if not sep:
                return None
            out[key] = value
            current = ""
            continue
        current += ch
    return out
