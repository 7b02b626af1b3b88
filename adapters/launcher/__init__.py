"""contractgen.adapters.launcher: the miles side of a true-on-policy contract.

Layout validation against the contract's model profile and parallel support (``layout``), one
table per target mapping typed policy fields to arguments and environment (``tables``), the
rendered launch plan (``plan``, ``formats``) and the rollout/trainer fingerprint handshake
(``handshake``). Contract data is read only through the generated modules.
"""

from .formats import FORMATS, to_json, to_json_data, to_shell, to_text
from .handshake import HandshakeError, HandshakeReport, check_handshake, handshake_report
from .layout import Layout, LayoutError, UnknownModelError, Violation, validate_layout
from .plan import LaunchPlan, PlanError, build_plan

__all__ = [
    "FORMATS",
    "HandshakeError",
    "HandshakeReport",
    "LaunchPlan",
    "Layout",
    "LayoutError",
    "PlanError",
    "UnknownModelError",
    "Violation",
    "build_plan",
    "check_handshake",
    "handshake_report",
    "to_json",
    "to_json_data",
    "to_shell",
    "to_text",
    "validate_layout",
]
