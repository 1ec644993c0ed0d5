"""What the description's fields that gpupool/spec/model.py gives no comment mean, for the
reference (gpupool/spec/reference.py) until the model says it beside each field.

A comment in model.py is the one source of a field's description: tests fail on an entry
here whose field the model now comments or no longer has, and on a field with neither
(a field of an enum type the enum's docstring describes needs none).
"""

from __future__ import annotations

# Keyed by class and Python field name (class_, not its YAML key class), as the model is.
UNSAID: dict[tuple[str, str], str] = {
    ("Description", "version"): "The schema version of the description: 1.",
    ("Description", "pool"): "The pool's identity and its pool-wide settings.",
    ("Description", "sites"): "The on-prem sites: site name -> its leaf switches and racks.",
    ("Description", "node_classes"): "The kinds of on-prem node: class name -> its hardware.",
    ("Description", "nodes"): "The on-prem nodes: node name (its host name) -> class, rack, "
                              "roles and addresses.",
    ("Description", "burst_groups"): "Cloud capacity the pool bursts into: group name -> "
                                     "its instances.",
    ("Description", "teams"): "The teams that share the pool: team name -> quotas and "
                              "members.",
    ("Description", "task_classes"): "The kinds of job: class name -> priority, limits and "
                                     "preemption.",
    ("Description", "storage_tiers"): "The storage tiers: tier name -> purpose, size, "
                                      "retention and where it lives.",
    ("Description", "lustre_client"): "Where the Lustre client comes from; needed when a "
                                      "tier mounts Lustre.",
    ("Description", "network"): "The network segments, the flows allowed between them and "
                                "the burst regions' links to on-prem.",
    ("Description", "software"): "The exact version of every component installed.",
    ("Description", "kubernetes"): "A Kubernetes cluster over the pool's nodes.",
    ("Description", "health"): "The health loop on every compute node.",
    ("Description", "backup"): "Backups of the Slurm controller.",
    ("Description", "failover"): "A backup Slurm controller.",
    ("Description", "ids"): "Fixed Unix ids of members and team groups.",
    ("Pool", "name"): "The pool's name: it names the cloud resources and buckets.",
    ("Pool", "environment"): "lab or production.",
    ("Pool", "cost_centre"): "The cost centre the pool's cloud resources are billed to.",
    ("Site", "leaf_switches"): "Leaf switch name -> the racks under it (Slurm's topology).",
    ("LeafSwitch", "racks"): "The racks under this switch; a rack is under one switch only.",
    ("NodeClass", "description"): "Free text for people.",
    ("NodeClass", "gpu"): "The class's GPUs; absent: a node without GPUs.",
    ("NodeClass", "nics"): "The network interfaces, one entry per kind.",
    ("NodeClass", "cpus"): "CPU cores per node.",
    ("NodeClass", "memory_gib"): "Memory per node, GiB.",
    ("NodeClass", "nvme"): "The local NVMe devices used for scratch.",
    ("Gpu", "model"): "The GPU model, one gpupool knows (`gpupool validate` lists them).",
    ("Gpu", "count"): "GPUs per node.",
    ("Gpu", "memory_gib"): "Memory per GPU, GiB: one size the model ships with.",
    ("Gpu", "interconnect"): "How the node's GPUs are linked to each other.",
    ("Gpu", "mig_strategy"): "How MIG devices are exposed; not none only on a MIG-capable "
                             "model, and one strategy for every MIG class.",
    ("Nic", "type"): "The kind of interface.",
    ("Nic", "count"): "Interfaces of this kind per node.",
    ("Nic", "speed_gbps"): "Each interface's speed, Gb/s.",
    ("Nvme", "count"): "Scratch NVMe devices per node.",
    ("Nvme", "size_gib"): "Each device's size, GiB.",
    ("Nvme", "devices"): "The scratch devices' stable paths (/dev/disk/by-id or by-path), "
                         "one per device; or `model` instead.",
    ("Node", "class_"): "The node's class: a key of `node_classes`.",
    ("Node", "rack"): "The node's rack: one listed under a site's leaf switch.",
    ("Node", "roles"): "What the node is: compute, controller, login (each once).",
    ("Node", "addresses"): "Segment name -> the node's address in it; every node has a "
                           "management address.",
    ("BurstGroup", "region"): "The AWS region the group's instances run in.",
    ("BurstGroup", "availability_zones"): "The zones of the region the instances may use.",
    ("BurstGroup", "instance_types"): "EC2 instance types, in order of preference; all "
                                      "carry the same GPUs (model and count).",
    ("BurstGroup", "capacity"): "Spot, on-demand or both (each once).",
    ("BurstGroup", "on_demand_base"): "Nodes always bought on demand before any spot; "
                                      "needs on-demand in capacity.",
    ("BurstGroup", "min_nodes"): "The fewest nodes the group runs; at most max_nodes.",
    ("BurstGroup", "max_nodes"): "The most nodes the group runs at once.",
    ("BurstGroup", "efa"): "Give the instances EFA interfaces (every type must have EFA).",
    ("Team", "cost_centre"): "The cost centre the team's usage is charged to.",
    ("Team", "quota"): "GPU model -> the GPUs the team is guaranteed.",
    ("Team", "borrowing_limit"): "GPU model -> how many GPUs beyond its quota the team "
                                 "may borrow when others leave them idle.",
    ("Team", "members"): "Role -> the team's members (Unix user names) in that role.",
    ("Ids", "users"): "Member -> uid (their own group's gid too).",
    ("Ids", "teams"): "Team -> its group's gid.",
    ("IdleReclaim", "after"): "How long a job's GPUs must stay idle before it is warned.",
    ("IdleReclaim", "warn"): "How long after the warning the job is ended or requeued if "
                             "still idle.",
    ("IdleReclaim", "action"): "What is done to an idle job: cancel, or requeue (only in a "
                               "class with requeue).",
    ("IdleReclaim", "threshold_percent"): "GPU utilization at or below which a GPU counts as "
                                          "idle.",
    ("TaskClass", "priority"): "The class's priority; unique among classes.",
    ("TaskClass", "max_runtime"): "The longest a job of the class may run.",
    ("TaskClass", "preemptible"): "Whether jobs of higher classes may preempt this "
                                  "class's jobs.",
    ("TaskClass", "grace_time"): "How long a preempted job has to save its work before it "
                                 "is stopped; preemptible classes only, shorter than "
                                 "max_runtime.",
    ("TaskClass", "requeue"): "Requeue a preempted job instead of cancelling it; "
                              "preemptible classes only.",
    ("TaskClass", "preempts"): "The task classes whose jobs this class preempts: each "
                               "preemptible and of lower priority.",
    ("TaskClass", "idle_reclaim"): "Reclaim the GPUs of this class's jobs that leave them "
                                   "idle; absent: never.",
    ("TaskClass", "description"): "Free text for people.",
    ("Mount", "path"): "Where the tier is mounted on the nodes; unique among tiers.",
    ("Mount", "fstype"): "The file system type.",
    ("Mount", "source"): "What is mounted: server:/export (NFS) or nid@net:/fsname "
                         "(Lustre); empty for local and object.",
    ("Mount", "options"): "Mount options, among those gpupool allows for the fstype "
                          "(such as noatime or vers=4.2), each once.",
    ("LustreClient", "repository"): "The apt repository's base URL (https, or http: apt "
                                    "checks what it serves against the signed Release "
                                    "file).",
    ("LustreClient", "suite"): "The repository's suite: a codename, or ./ for a flat "
                               "repository.",
    ("LustreClient", "components"): "The repository's components; none for a flat "
                                    "repository.",
    ("LustreClient", "version"): "The client version every node is pinned to.",
    ("Transition", "after_days"): "Days after an object is written that it moves; "
                                  "transitions come in increasing days, before retention "
                                  "ends.",
    ("Transition", "temperature"): "The colder temperature it moves to.",
    ("StorageTier", "purpose"): "What the tier holds.",
    ("StorageTier", "temperature"): "How quickly its data must be reachable.",
    ("StorageTier", "size_tib"): "Its size, TiB.",
    ("StorageTier", "retention_days"): "How many days data is kept.",
    ("StorageTier", "mount"): "How nodes mount it; absent: a bucket only.",
    ("StorageTier", "versioning"): "Keep earlier versions of a bucket's objects.",
    ("StorageTier", "lifecycle"): "When a bucket's objects move to colder storage.",
    ("Segment", "cidr"): "The segment's on-prem network.",
    ("Segment", "cloud_cidr"): "The segment's network in the burst VPC; required when "
                               "there are burst groups.",
    ("Segment", "vlan"): "The segment's VLAN id; unique among segments.",
    ("Segment", "mtu"): "The segment's MTU.",
    ("Segment", "rdma"): "Whether the segment carries RDMA.",
    ("Flow", "from_"): "The segment the traffic comes from.",
    ("Flow", "to"): "The segment it goes to.",
    ("Flow", "protocol"): "tcp, udp or all.",
    ("Flow", "ports"): "The ports allowed; required for tcp and udp.",
    ("Flow", "description"): "Free text for people.",
    ("Vpn", "bgp_asn"): "The customer gateway's BGP ASN.",
    ("HybridLink", "vpn"): "A site-to-site VPN to the on-prem customer gateway.",
    ("HybridLink", "transit_gateway"): "An existing Transit Gateway's id (tgw-...).",
    ("HybridLink", "direct_connect_gateway"): "An existing Direct Connect gateway's id.",
    ("Network", "admin_cidrs"): "The networks administrators reach the pool from; never "
                                "the whole internet.",
    ("Network", "segments"): "Segment name -> its network; training, storage and "
                             "management are required.",
    ("Network", "flows"): "The traffic allowed between segments; anything else is refused.",
    ("Software", "nvidia_driver"): "The NVIDIA driver's version.",
    ("Software", "cuda"): "CUDA's version.",
    ("Software", "container_toolkit"): "The NVIDIA Container Toolkit's version.",
    ("Software", "dcgm"): "DCGM's version.",
    ("Software", "nccl"): "NCCL's version.",
    ("Software", "slurm"): "Slurm's version.",
    ("Health", "interval"): "How often each node gates itself.",
    ("Health", "window"): "The window in which isolate_after failures isolate a node.",
    ("Backup", "interval"): "How often a backup is taken (10 minutes to 7 days).",
    ("Backup", "keep"): "How many backups are kept.",
    ("Kubernetes", "control_plane"): "The nodes (keys of `nodes`) that run the control "
                                     "plane, each once.",
}
