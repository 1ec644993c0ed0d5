"""What on-call should do about a failed check, and the XID-to-action map.

Actions follow the vocabulary of AWS's GPU health-check suite, which operators coming
from ParallelCluster or HyperPod already know.
"""

from __future__ import annotations

from enum import StrEnum


class Action(StrEnum):
    ISOLATE = "isolate"  # drain and keep out: hardware needs service or replacement
    RESET = "reset"  # drain, reset the GPU (nvidia-smi -r), re-run the gate
    REBOOT = "reboot"  # drain, reboot the node, re-run the gate
    RECONFIGURE = "reconfigure"  # re-run the node's roles: configuration drifted
    MONITOR = "monitor"  # keep serving; watch the trend


# NVIDIA XID codes seen on data-centre GPUs, from NVIDIA's XID catalogue.
XID_ACTIONS: dict[int, tuple[Action, str]] = {
    13: (Action.MONITOR, "graphics engine exception (usually the application)"),
    31: (Action.MONITOR, "GPU memory page fault (usually the application)"),
    43: (Action.MONITOR, "GPU stopped processing (usually the application)"),
    45: (Action.MONITOR, "preemptive cleanup after a killed process"),
    48: (Action.RESET, "double-bit ECC error"),
    61: (Action.RESET, "internal micro-controller breakpoint"),
    62: (Action.RESET, "internal micro-controller halt"),
    63: (Action.RESET, "ECC page retirement or row remapping recorded"),
    64: (Action.ISOLATE, "ECC page retirement or row remapping failed"),
    74: (Action.RESET, "NVLink error"),
    79: (Action.REBOOT, "GPU has fallen off the bus"),
    92: (Action.MONITOR, "high single-bit ECC error rate"),
    94: (Action.RESET, "contained ECC error"),
    95: (Action.ISOLATE, "uncontained ECC error"),
    119: (Action.REBOOT, "GSP RPC timeout"),
    120: (Action.REBOOT, "GSP error"),
    140: (Action.ISOLATE, "unrecovered ECC error"),
}

_SEVERITY = [Action.MONITOR, Action.RECONFIGURE, Action.RESET, Action.REBOOT, Action.ISOLATE]


def xid_action(code: int) -> Action:
    # An unknown XID is treated like a hardware fault until someone has looked.
    return XID_ACTIONS.get(code, (Action.ISOLATE, "unknown XID"))[0]


def worst(actions: list[Action]) -> Action | None:
    return max(actions, key=_SEVERITY.index) if actions else None
