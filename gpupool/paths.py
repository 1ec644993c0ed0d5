"""Where gpupool's own files are: the project root, its Ansible settings and vendored data.

A leaf module (stdlib only), so that the lab, the gate and the previews can find the
checkout without importing the description's loader.
"""

from __future__ import annotations

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
# The Ansible settings every playbook run and the gate's testinfra use.
ANSIBLE_CONFIG = PROJECT_ROOT / "ansible.cfg"
# Third-party data files gpupool reads (schemas, a public trace), each with its SOURCE.md.
DATA = Path(__file__).resolve().parent / "data"
# A pool project is a folder holding a Pulumi.yaml (and Pulumi.<stack>.yaml per stack).
PROJECT_FILE = "Pulumi.yaml"


def find_project(start: Path) -> Path | None:
    """The nearest folder from start upwards that holds a Pulumi.yaml, if any."""
    start = start.resolve()
    return next((d for d in (start, *start.parents) if (d / PROJECT_FILE).is_file()), None)
