"""What a drill or a replay on the lab works with: the description and its running Slurm,
and the few things both derive from the description (checkpoint root, a team, classes)."""

from __future__ import annotations

from dataclasses import dataclass

from gpupool.lab.slurm_cluster import SlurmLab
from gpupool.render import slurm
from gpupool.render.scheduling import class_policies
from gpupool.spec.model import Description, Purpose


@dataclass
class Context:
    desc: Description
    slurm: SlurmLab

    @property
    def root(self) -> str:
        """The shared checkpoint tier's mount point on every lab host."""
        return next(t.mount.path for t in self.desc.storage_tiers.values()
                    if t.purpose is Purpose.CHECKPOINTS and t.mount is not None)

    @property
    def team(self) -> str:
        return next(iter(self.desc.teams))

    def classes(self) -> tuple[str, str, str]:
        """(top, a non-preemptible middle class, the lowest preemptible class)."""
        cs = class_policies(self.desc)
        top = cs[0].name
        mid = next(c.name for c in cs[1:] if not c.preemptible)
        low = next(c.name for c in reversed(cs) if c.preemptible)
        return top, mid, low

    def gpus_per_node(self) -> int:
        return next(n.gpus for n in slurm.nodes(self.desc) if not n.cloud)
