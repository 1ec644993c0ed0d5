"""Load only the pulumi_aws and pulumi_kubernetes modules the program uses.

Their packages per service and API version (`pulumi_aws.ec2`, `pulumi_kubernetes.core.v1`)
are loaded lazily, but the first use of any class runs the package's `__init__`, which
imports every resource module in it (about 190 for ec2): some 1.4 CPU-seconds of every
`gpupool plan` and `gpupool policy`, whatever the pool's size, for the 35 classes the
program declares.

`preload()` gives each such package a module whose `__init__` has not run, holding the
program's modules (and what they import, the package's shared input and output types),
their names copied in as the package's `from .vpc import *` would. Reading any other name
from it (a new component, `gpupool.preview.aws_types`' tag lookup of another type, a test)
completes the package: its `__init__` runs then, into the same module object, so classes
keep their identity. A package already loaded is used as it is.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import types
from typing import Any

# Package -> the modules (files) whose classes and functions the program uses. One left
# out costs time, not correctness: the first use of its name completes the package.
MODULES: dict[str, tuple[str, ...]] = {
    "pulumi_aws.autoscaling": ("group",),
    "pulumi_aws.cloudwatch": ("log_group",),
    "pulumi_aws.directconnect": ("gateway_association",),
    "pulumi_aws.ec2": ("customer_gateway", "default_security_group", "eip", "flow_log",
                       "get_ami", "internet_gateway", "launch_template", "managed_prefix_list",
                       "nat_gateway",
                       "placement_group", "route_table", "route_table_association",
                       "security_group", "subnet", "vpc", "vpc_endpoint",
                       "vpc_ipv4_cidr_block_association", "vpn_connection", "vpn_gateway"),
    "pulumi_aws.ec2transitgateway": ("vpc_attachment",),
    "pulumi_aws.fsx": ("lustre_file_system",),
    "pulumi_aws.imagebuilder": ("component", "distribution_configuration", "image",
                                "image_pipeline", "image_recipe",
                                "infrastructure_configuration"),
    "pulumi_aws.iam": ("instance_profile", "policy", "role", "role_policy",
                       "role_policy_attachment"),
    "pulumi_aws.kms": ("alias", "key"),
    "pulumi_aws.s3": ("bucket", "bucket_lifecycle_configuration", "bucket_ownership_controls",
                      "bucket_policy", "bucket_public_access_block",
                      "bucket_server_side_encryption_configuration", "bucket_versioning"),
    "pulumi_aws.secretsmanager": ("secret", "secret_policy"),
    "pulumi_aws.vpc": ("security_group_egress_rule", "security_group_ingress_rule"),
    "pulumi_kubernetes.admissionregistration.v1": ("ValidatingAdmissionPolicy",
                                                   "ValidatingAdmissionPolicyBinding"),
    "pulumi_kubernetes.core.v1": ("ConfigMap", "LimitRange", "Namespace", "ResourceQuota"),
    "pulumi_kubernetes.networking.v1": ("NetworkPolicy",),
    "pulumi_kubernetes.rbac.v1": ("Role", "RoleBinding"),
    "pulumi_kubernetes.scheduling.v1": ("PriorityClass",),
}


def preload(modules: dict[str, tuple[str, ...]] = MODULES) -> None:
    for fullname, names in modules.items():
        package = _package(fullname)
        # While partial, the package's __getattr__ completes it; not while its own modules
        # load (their `from . import outputs` asks the package for a module not loaded yet).
        complete = vars(package).pop("__getattr__", None)
        try:
            for name in names:
                module = importlib.import_module(f"{fullname}.{name}")
                if complete is not None:  # partial: export as `from .name import *` would
                    for public in getattr(module, "__all__", ()):
                        setattr(package, public, getattr(module, public))
        finally:
            if complete is not None:
                package.__getattr__ = complete  # type: ignore[method-assign]


def _package(fullname: str) -> types.ModuleType:
    """The package: as it is when already loaded (or partial), else a partial one in place
    of the lazy module pulumi_aws or pulumi_kubernetes registered (if any)."""
    current = sys.modules.get(fullname)
    # pulumi's lazy modules are instances of a ModuleType subclass until first used.
    if current is not None and type(current) is types.ModuleType:
        return current
    parent, _, child = fullname.rpartition(".")
    spec = importlib.machinery.PathFinder.find_spec(
        fullname, importlib.import_module(parent).__path__)
    if spec is None or spec.loader is None:
        return importlib.import_module(fullname)
    package = importlib.util.module_from_spec(spec)
    loader = spec.loader

    def complete(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        del package.__getattr__
        loader.exec_module(package)  # the package's own __init__, into the same module
        return getattr(package, name)

    package.__getattr__ = complete  # type: ignore[method-assign]
    sys.modules[fullname] = package
    setattr(sys.modules[parent], child, package)
    return package
