"""What pulumi_aws's classes say about an AWS resource type: whether it takes tags.

Asked of the classes themselves (imported on demand, by type token), so it belongs with
the previews that run the Pulumi program, not with the renderers (render imports no
Pulumi). The policy pack's cost-tag rule and the program's tests use it.
"""

from __future__ import annotations

import functools
import importlib
import inspect


@functools.cache
def aws_taggable(type_token: str) -> bool:
    """Whether an AWS resource type takes tags: its pulumi_aws class has a tags argument.

    'aws:ec2/vpc:Vpc' -> pulumi_aws.ec2.Vpc; providers and other packages are not AWS
    resources."""
    pkg, _, rest = type_token.partition(":")
    if pkg != "aws" or ":" not in rest:
        return False
    module, _, cls = rest.partition(":")
    klass = getattr(importlib.import_module(f"pulumi_aws.{module.split('/')[0]}"), cls)
    return "tags" in inspect.signature(klass._internal_init).parameters
