"""Ansible inventory plugin `gpupool`: a stack's inventory read from its pool description
at every run, so it is never stale.

The hosts, groups and variables are those `gpupool inventory --stack STACK` writes
(gpupool.render.inventory.build over the stack's description and connection settings);
this file only hands them to Ansible. An invalid description or an unknown stack is an
AnsibleParserError listing every problem.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ansible.errors import AnsibleParserError
from ansible.plugins.inventory import BaseInventoryPlugin
from ansible.template import trust_as_template

DOCUMENTATION = r"""
name: gpupool
short_description: a gpupool stack's hosts, groups and variables, from its pool description
description:
  - Reads the stack's pool description (Pulumi.<stack>.yaml names it) and its connection
    settings (the stack config's gpupool:connection) and builds the same inventory as
    C(gpupool inventory --stack STACK) writes to a file.
  - The source file's name must end in C(gpupool.yml) or C(gpupool.yaml).
  - Ansible must run on a Python that has gpupool installed (gpupool's virtualenv).
options:
  plugin:
    description: This plugin's name.
    required: true
    choices: [gpupool]
  stack:
    description: The stack whose description is read.
    type: str
    required: true
  project:
    description:
      - The pool project folder (holding Pulumi.yaml), relative to this file's folder.
      - By default the nearest folder from this file's folder upwards holding a Pulumi.yaml.
    type: str
"""

EXAMPLES = r"""
# gpupool.yml, beside Pulumi.yaml
plugin: gpupool
stack: prod
"""

SUFFIXES = ("gpupool.yml", "gpupool.yaml")


class InventoryModule(BaseInventoryPlugin):
    NAME = "gpupool"

    def verify_file(self, path: str) -> bool:
        return super().verify_file(path) and path.endswith(SUFFIXES)

    def parse(self, inventory: Any, loader: Any, path: str, cache: bool = True) -> None:
        super().parse(inventory, loader, path, cache)
        self._read_config_data(path)
        try:
            from gpupool.paths import PROJECT_FILE, find_project  # noqa: PLC0415
            from gpupool.render.inventory import build  # noqa: PLC0415
            from gpupool.spec import connection  # noqa: PLC0415
            from gpupool.spec.errors import DescriptionError  # noqa: PLC0415
        except ImportError as exc:
            # Imported here so the message can say what to do instead of a traceback.
            raise AnsibleParserError(
                f"{path}: [gpupool-importable] this Ansible's Python cannot import gpupool "
                f"({exc}); run Ansible from gpupool's virtualenv") from None
        here = Path(path).resolve().parent
        project = self.get_option("project")
        root = (here / project).resolve() if project else find_project(here)
        if root is None or not (root / PROJECT_FILE).is_file():
            raise AnsibleParserError(
                f"{path}: project: [project-exists] no {PROJECT_FILE} in "
                f"{root or f'{here} or a folder above'}; set project: to the pool project")
        try:
            desc, conn = connection.load(self.get_option("stack"), root)
        except DescriptionError as exc:
            raise AnsibleParserError(f"invalid: {exc}") from None
        self._add_group("all", build(desc, connection=conn, cache_dir=root / ".cache")["all"])

    def _add_group(self, name: str, data: dict[str, Any]) -> None:
        """One group of the YAML inventory structure, as Ansible's yaml plugin reads it."""
        from gpupool.render.ansible_yaml import Template  # noqa: PLC0415

        self.inventory.add_group(name)
        for var, value in (data.get("vars") or {}).items():
            # Nothing a plugin sets is evaluated unless marked (ansible-core 2.19), which
            # keeps a description's text inert; gpupool's own templates are marked.
            self.inventory.set_variable(
                name, var, trust_as_template(str(value)) if isinstance(value, Template) else value)
        for host, host_vars in (data.get("hosts") or {}).items():
            self.inventory.add_host(host, group=name)
            for var, value in (host_vars or {}).items():
                self.inventory.set_variable(host, var, value)
        for child, child_data in (data.get("children") or {}).items():
            self._add_group(child, child_data or {})
            self.inventory.add_child(name, child)
