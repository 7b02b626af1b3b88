"""``adopt``: what replacing a hand-kept vendored package with the generated one changes.

Two comparisons, name by name. Statically (``ast``): each module-level public name of every file
sync would overwrite. Dynamically: both versions are imported (``adopt_probe.py``, in a
subprocess each, the package's ``__init__.py`` not run) and compared: dataclass fields (added,
removed, reordered, defaults), parameters (renamed, re-kinded, defaults), constants, error types
and messages, and the results of the public functions and of the contract objects' methods over a
probe grid (contract ids, TP / CP / ``cp_comm_type`` forms, batch-invariant mode, rollout TP,
backends, targets, K sizes). Each difference is one ``Change``; breaking ones are refused unless
allowed by name (``--allow-drop`` for a dropped name or field, ``--allow-change`` for the rest).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath

from .adopt_compare import (
    compare_outcomes,
    fields_changes,
    outcome_text,
    params_changes,
    value_change,
)
from .config import ProjectConfig
from .drift import extra_files, target_files
from .fingerprint import split_generated
from .locate import MissingAnchorError, config_lines, misplaced, missing_anchor
from .public_names import public_names
from .sync import check_repo_is_right, sibling_packages

PROBE = Path(__file__).with_name("adopt_probe.py")
PUBLIC_IDS = ("qwen3_dense_true_on_policy_v1", "qwen3_moe_true_on_policy_v1")


@dataclass(frozen=True)
class Change:
    """One difference; ``refuse`` is the flag that allows it ("" when it needs none)."""

    target: str
    file: str  # path inside the sibling repo
    name: str  # the public name it is about (what --allow-drop / --allow-change take)
    kind: str  # added | dropped | changed | field | param | value | error | file | contracts
    detail: str
    old: str = ""
    new: str = ""
    refuse: str = ""  # "--allow-drop" | "--allow-change" | "config" | ""

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class AdoptPlan:
    changes: list[Change] = field(default_factory=list)
    probes: dict[str, tuple[int, int]] = field(default_factory=dict)  # target -> (run, differ)
    notes: list[str] = field(default_factory=list)
    new_packages: list[str] = field(default_factory=list)  # targets written as a new package
    skipped: list[str] = field(default_factory=list)  # targets whose repo has no package

    def refused(self, drops: set[str], changes: set[str]) -> list[Change]:
        out = []
        for c in self.changes:
            allowed = (c.refuse == "--allow-drop" and _allowed(c.name, drops)) or (
                c.refuse == "--allow-change" and _allowed(c.name, changes | drops)
            )
            if c.refuse and not allowed:
                out.append(c)
        return out


def _allowed(name: str, allowed: set[str]) -> bool:
    """``name`` (``Cls.field``, ``fn(…)``, ``OBJ.method(…)``) or its top-level name is allowed."""
    top = name.split("(", 1)[0].split(".", 1)[0]
    return name in allowed or top in allowed or name.split("(", 1)[0] in allowed


# --- dynamic: import both versions ----------------------------------------------------------


def import_root(repo: Path, package: str) -> tuple[Path, str]:
    """The folder the package is imported from and its dotted name: up from the package while
    the parent folder is a package (has ``__init__.py``); ``python/sglang/srt/true_on_policy`` in
    the SGLang repo is ``sglang.srt.true_on_policy`` under ``python/``."""
    parts = list(PurePosixPath(package).parts)
    start = len(parts) - 1
    while start > 0 and (repo.joinpath(*parts[:start]) / "__init__.py").is_file():
        start -= 1
    return repo.joinpath(*parts[:start]), ".".join(parts[start:])


def probe(root: Path, dotted: str, stems: list[str], names: dict[str, list[str]],
          ids: list[str]) -> dict:  # fmt: skip
    """``adopt_probe.describe`` of the package at ``root``/``dotted``, in a fresh interpreter."""
    spec = {"root": str(root), "package": dotted, "modules": stems, "names": names, "ids": ids}
    done = subprocess.run([sys.executable, "-I", "-B", str(PROBE), json.dumps(spec)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    if done.returncode != 0:
        return {"modules": {}, "probes": {}, "errors": {"*": done.stderr.strip()[-2000:]}}
    return json.loads(done.stdout)


def _dynamic(target: str, old: dict, new: dict, files: dict[str, str]) -> tuple[list[Change], int, int]:  # fmt: skip
    """Changes from the two probe reports; (changes, probes run, probes that differ)."""
    changes: list[Change] = []
    for stem, names in old["modules"].items():
        rel = files[stem]
        new_names = new["modules"].get(stem, {})
        for name, entry in names.items():
            other = new_names.get(name)
            if other is None:
                continue  # a dropped name: reported by the static comparison
            if entry.get("kind") != other.get("kind"):
                changes.append(Change(target, rel, name, "changed",
                                      f"{entry.get('kind')} -> {other.get('kind')}",
                                      refuse="--allow-change"))  # fmt: skip
                continue
            if entry["kind"] == "class":
                for fname, detail, refuse in fields_changes(entry.get("fields") or [],
                                                             other.get("fields") or []):  # fmt: skip
                    shown = f"{name}.{fname}" if fname else name
                    changes.append(Change(target, rel, shown, "field", detail, refuse=refuse))
                for method, params in (entry.get("methods") or {}).items():
                    new_params = (other.get("methods") or {}).get(method)
                    if new_params is None:
                        changes.append(Change(target, rel, f"{name}.{method}", "dropped",
                                              "method removed", refuse="--allow-drop"))  # fmt: skip
                        continue
                    for detail, refuse in params_changes(method, params or [], new_params or []):
                        changes.append(Change(target, rel, f"{name}.{method}", "param", detail,
                                              refuse=refuse))  # fmt: skip
                for prop in set(entry.get("properties") or []) - set(other.get("properties") or []):
                    changes.append(Change(target, rel, f"{name}.{prop}", "dropped",
                                          "property removed", refuse="--allow-drop"))  # fmt: skip
            elif entry["kind"] == "function":
                for detail, refuse in params_changes(name, entry.get("params") or [],
                                                      other.get("params") or []):  # fmt: skip
                    changes.append(Change(target, rel, name, "param", detail, refuse=refuse))
            else:
                found = value_change(entry, other)
                if found:
                    changes.append(Change(target, rel, name, "value", found[0], entry["value"],
                                          other["value"], refuse=found[1]))  # fmt: skip
    run = differ = 0
    info: dict[tuple[str, str, str], list[str]] = {}  # (file, callable, detail) -> probes
    for key, outcome in sorted(old["probes"].items()):
        if key not in new["probes"]:
            continue
        run += 1
        found = compare_outcomes(key, outcome, new["probes"][key])
        if not found:
            continue
        rel = next((files[s] for s, n in old["modules"].items()
                    if key.split("(", 1)[0].split(".", 1)[0] in n), "")  # fmt: skip
        if not found[1]:  # compatible (a subclass error, added fields): one line per callable
            info.setdefault((rel, key.split("(", 1)[0], found[0]), []).append(key)
            continue
        differ += 1
        kind = "error" if "raises" in outcome or "raises" in new["probes"][key] else "value"
        changes.append(Change(target, rel, key, kind, found[0], outcome_text(outcome),
                              outcome_text(new["probes"][key]), refuse=found[1]))  # fmt: skip
    for (rel, name, detail), keys in sorted(info.items()):
        shown = keys[0] if len(keys) == 1 else f"{name}(…)"
        changes.append(Change(target, rel, shown, "error" if "error" in detail else "value",
                              f"{detail} (in {len(keys)} probe(s), e.g. {keys[0]})"))  # fmt: skip
    return changes, run, differ


def _implemented_today(old: dict) -> list[str] | None:
    """The ids the hand-kept ``get_true_on_policy_contract`` accepts (None if not probed)."""
    accepted = {key[len("get_true_on_policy_contract(") + 1 : -2]: "value" in outcome
                for key, outcome in old["probes"].items()
                if key.startswith("get_true_on_policy_contract('")}  # fmt: skip
    if not accepted:
        return None
    return sorted(cid for cid, ok in accepted.items() if ok)


def plan_adopt(
    vendored: dict[str, bytes],
    target: str,
    repo: Path,
    config: ProjectConfig,
    known_ids: list[str] | None = None,
    allow_new_package: bool = False,
) -> AdoptPlan:
    """Every change that syncing ``target`` into ``repo`` makes to its hand-kept package.

    A repo without the package has nothing to take over: the target is skipped with a note, or,
    with ``allow_new_package``, written as a complete new package (``__init__.py`` included),
    which nothing in the repo imports until someone wires it in."""
    plan = AdoptPlan()
    package = config.package(target)
    check_repo_is_right(repo, target, config)
    elsewhere = misplaced(repo, target, package, sibling_packages(target, config))
    if elsewhere:
        plan.changes.append(Change(target, package, package, "contracts", elsewhere,
                                   refuse="config"))  # fmt: skip
        return plan
    missing = missing_anchor(repo, target, package, config.targets[target].repo)
    if missing:
        raise MissingAnchorError(missing)
    if not (repo / package).is_dir():
        return _new_package(plan, target, repo, package, allow_new_package)
    files = target_files(vendored, target, config)
    hand_kept = _file_changes(plan, target, repo, package, files)
    if not hand_kept:
        return plan
    root, dotted = import_root(repo, package)
    static_old = _static_changes(plan, target, repo, dotted, files, hand_kept)
    old_report, new_report = _probe_both(root, dotted, files, hand_kept, static_old, known_ids)
    for where, report in (("hand-kept", old_report), ("generated", new_report)):
        for stem, error in report["errors"].items():
            plan.notes.append(f"{target}: could not import the {where} {stem}: {error}; its "
                              "values are not compared")  # fmt: skip
    by_stem = {PurePosixPath(rel).stem: rel for rel in files}
    changes, run, differ = _dynamic(target, old_report, new_report, by_stem)
    plan.changes += changes
    plan.probes[target] = (run, differ)
    today = _implemented_today(old_report)
    if today is not None:
        plan.changes.append(_contracts_change(target, package, today, config))
    return plan


def _new_package(plan: AdoptPlan, target: str, repo: Path, package: str, allow: bool) -> AdoptPlan:
    if not allow:
        plan.skipped.append(target)
        plan.notes.append(
            f"{target}: {repo} has no {package}/, so there is no hand-kept package to take over; "
            "not created (--allow-new-package writes a complete new package there, which nothing "
            "in the repo imports until you wire it in)"
        )
        return plan
    plan.new_packages.append(target)
    plan.changes.append(
        Change(target, package, package, "file", "new package, not imported by the repo")
    )
    return plan


def _file_changes(
    plan: AdoptPlan, target: str, repo: Path, package: str, files: dict[str, bytes]
) -> dict[str, bytes]:
    """One ``file`` change per created, replaced or removed file; the hand-kept files by path."""
    hand_kept: dict[str, bytes] = {}
    for rel in sorted(files):
        dest = repo / rel
        if not dest.is_file():
            plan.changes.append(Change(target, rel, PurePosixPath(rel).name, "file",
                                       "new file (generated)"))  # fmt: skip
            continue
        current = dest.read_bytes()
        if split_generated(current) is not None:
            continue  # already contractgen's: sync's own checks (hand edits, conflicts) apply
        hand_kept[rel] = current
        plan.changes.append(Change(target, rel, PurePosixPath(rel).name, "file",
                                   "hand-kept file replaced by the generated one"))  # fmt: skip
    stamped, own = extra_files(files, repo, package)
    for rel in stamped:
        plan.changes.append(Change(target, rel, PurePosixPath(rel).name, "file",
                                   "removed (stamped by contractgen; no contract produces it)"))  # fmt: skip
    if own:
        plan.notes.append(f"{target}: {len(own)} module(s) of the repo's own in {package}/ are "
                          "left alone: " + ", ".join(PurePosixPath(r).name for r in own))  # fmt: skip
    return hand_kept


def _static_changes(
    plan: AdoptPlan,
    target: str,
    repo: Path,
    dotted: str,
    files: dict[str, bytes],
    hand_kept: dict[str, bytes],
) -> dict[str, dict[str, str]]:
    """Added and dropped public names, file by file; the hand-kept files' public names."""
    static_new = {rel: public_names(content, dotted) for rel, content in files.items()}
    static_old = {}
    for rel, content in hand_kept.items():
        try:
            static_old[rel] = public_names(content, dotted)
        except SyntaxError as exc:
            raise ValueError(
                f"{repo / rel}: does not parse ({exc.msg}, line {exc.lineno})"
            ) from None
    for rel, old in static_old.items():
        new = static_new[rel]
        for name in sorted(set(old) | set(new)):
            if name not in old:
                plan.changes.append(Change(target, rel, name, "added", "new name", new=new[name]))
            elif name not in new:
                elsewhere_names = sorted(r for r, ns in static_new.items() if name in ns)
                hint = (f"; still defined in {elsewhere_names[0]} (import it from there)"
                        if elsewhere_names else "")  # fmt: skip
                plan.changes.append(Change(target, rel, name, "dropped",
                                           f"public name removed{hint}", old=old[name],
                                           refuse="--allow-drop"))  # fmt: skip
    return static_old


def _probe_both(
    root: Path,
    dotted: str,
    files: dict[str, bytes],
    hand_kept: dict[str, bytes],
    static_old: dict[str, dict[str, str]],
    known_ids: list[str] | None,
) -> tuple[dict, dict]:
    """The probe reports of the hand-kept package (in the repo) and of the generated one (in a
    temp folder)."""
    stems = sorted({PurePosixPath(rel).stem for rel in hand_kept} | {"runtime_policy"})
    names = {PurePosixPath(rel).stem: sorted(static_old.get(rel, {})) for rel in hand_kept}
    stems = [s for s in stems if s != "__init__" and s in names]
    ids = sorted({*(known_ids or []), *PUBLIC_IDS} - {"unknown_contract"}) + ["unknown_contract"]
    old_report = probe(root, dotted, stems, names, ids)
    with tempfile.TemporaryDirectory(prefix="contractgen-adopt-") as tmp:
        new_root = Path(tmp)
        for rel, content in files.items():
            dest = new_root.joinpath(*dotted.split("."), PurePosixPath(rel).name)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(content)
        new_report = probe(new_root, dotted, stems, names, ids)
    return old_report, new_report


def _contracts_change(target: str, package: str, today: list[str], config: ProjectConfig) -> Change:
    """What the hand-kept package implements today against the contract set declared for it."""
    declared = config.declared.get(target)
    if declared is None:
        return Change(
            target, package, "contracts", "contracts",
            f"the repo implements {', '.join(today) or 'no contract'} today, but "
            f"contractgen.toml declares no contract set for {target} (every contract would "
            f"be vendored and accepted). Declare it:\n{config_lines(target, package, tuple(today))}",
            refuse="config",
        )  # fmt: skip
    return Change(target, package, "contracts", "contracts",
                  f"implements today: {', '.join(today)}; declared in "
                  f"contractgen.toml: {', '.join(declared)}")  # fmt: skip
