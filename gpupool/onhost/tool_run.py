"""Run a tool on a host, bounded in time, its failure a one-line message (ToolFailed).

The on-host programs that drive tools (image_pull: skopeo and umoci; registry_prune:
systemctl and docker-registry) share it, so a tool that hangs fails the program instead of
holding it, and what the tool said last is what the operator reads. Stdlib only: role
image_registry copies it beside the programs that import it (gpupool's on-host programs
import nothing else of gpupool).
"""

from __future__ import annotations

import subprocess


class ToolFailed(RuntimeError):
    """A tool that could not start, ran past its time or exited non-zero. `last` is the last
    line it wrote (stderr, else stdout), for callers that tell its errors apart."""

    def __init__(self, message: str, last: str = "") -> None:
        super().__init__(message)
        self.last = last


def run(argv: list[str], timeout: int) -> str:
    """Run argv (no shell) within timeout seconds and return what it wrote to stdout;
    ToolFailed names the tool and its subcommand (argv[:2])."""
    what = " ".join(argv[:2])
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              check=False)
    except subprocess.TimeoutExpired:
        raise ToolFailed(f"{what} did not finish within {timeout} s") from None
    except OSError as exc:
        raise ToolFailed(f"cannot run {argv[0]}: {exc}") from None
    if proc.returncode != 0:
        lines = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        last = lines[-1] if lines else "no output"
        raise ToolFailed(f"{what} exited {proc.returncode}: {last[:400]}", last)
    return proc.stdout
