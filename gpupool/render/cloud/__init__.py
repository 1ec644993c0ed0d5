"""The AWS side of a pool as plain data, one renderer per capability.

- names.py: resource names and tags, and the regions the pool lives in;
- network.py: subnets, security group rules, prefix lists, VPC endpoints, hybrid routes, NAT;
- storage.py: bucket tiers, lifecycle, bucket policies, FSx scratch, the pool key's policy,
  mount units;
- iam.py: the burst nodes' run and boot role policies, the munge key's readers, the burst
  launcher's and the controller backups' policies;
- launch.py: a burst node's launch: its image's parent, its launch template's shape, the
  user-data that boots it and the facts it leaves on the node.

The Pulumi program (infra/) turns these into resources and the policy pack (policies/)
checks resources against them, so both read one derivation of the description. Import each
name from the module that owns it: this package re-exports nothing.
"""
