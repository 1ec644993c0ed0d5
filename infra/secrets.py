"""MungeKey: the pool's munge key as a Secrets Manager secret that only burst nodes read."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from gpupool.render.cloud import iam
from gpupool.render.cloud.iam import MungePlan
from infra.components import Component


@dataclass(frozen=True)
class MungeKeyArgs:
    plan: MungePlan
    key_arn: pulumi.Input[str]  # the pool key (StorageTiers), in the pool's cloud region
    # burst group -> its nodes' boot role (the run role they swap to reads no secret)
    roles: dict[str, aws.iam.Role]


class MungeKey(Component):
    """The secret (in the pool's cloud region, encrypted with the pool key, replicated to
    every other burst region so nodes read it through their own region's endpoint), a
    secret policy that denies reading it to everyone but the burst nodes' boot roles, and
    per group an inline boot role policy allowing exactly that read. A node swaps its boot
    profile for its run profile once the key is in place (launch.user_data), so the read
    ends with the boot.

    The program declares no value. The key must be the one the controller already uses
    (roles/slurm generates it there once), so a value generated here would not join the
    pool, and any value the program set, even as a Pulumi secret, would sit in the state.
    An operator puts the controller's key once, from the controller:
    `aws secretsmanager put-secret-value --region <cloud region> --secret-id
    gpupool/<pool>/munge-key --secret-binary fileb:///etc/munge/munge.key`.
    Until then a burst node's user-data gives up after its bounded retries, and the node
    is terminated at ResumeTimeout."""

    secret_arn: pulumi.Output[str]

    def __init__(self, name: str, args: MungeKeyArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("MungeKey", name, opts)
        plan = args.plan
        secret = aws.secretsmanager.Secret(
            name, name=plan.secret_name, kms_key_id=args.key_arn,
            description=f"gpupool {plan.pool} munge key (read by burst nodes only)",
            replicas=[{"region": r} for r in plan.replicas], tags=plan.tags,
            opts=self.child())
        role_arns = [args.roles[g].arn for g in sorted(args.roles)]
        aws.secretsmanager.SecretPolicy(
            name, secret_arn=secret.arn, block_public_policy=True,
            policy=pulumi.Output.all(*role_arns).apply(
                lambda arns: json.dumps(iam.munge_secret_policy(list(arns)))),
            opts=self.child())
        for group_name, role in sorted(args.roles.items()):
            aws.iam.RolePolicy(
                f"{name}-{group_name}", role=role.name,
                policy=pulumi.Output.all(secret.arn, args.key_arn).apply(
                    lambda a, r=plan.group_regions[group_name]: json.dumps(
                        iam.munge_read_policy_in(r, plan.home_region, a[0], a[1]))),
                opts=self.child())
        self.secret_arn = secret.arn
        self.register_outputs({"secret_arn": self.secret_arn})
