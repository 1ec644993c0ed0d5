"""Ansible strategy `mitogen_linear`, the default of gpupool's ansible.cfg.

Mitogen's linear strategy: the same tasks, in the same order, with the same modules, but one
Python per host for the whole play instead of a fresh interpreter (and SSH round trips) per
task. On the onboarding bench that per-task start-up was most of a re-run's time on the
control side and on the node (bench/RESULTS.md). Mitogen comes with `gpupool[lab]`, next to
Ansible; where it is missing (Debian's own ansible package, say) this falls back to Ansible's
`linear` strategy and says so, so a play never fails for the want of a speed-up.
`ANSIBLE_STRATEGY=linear` chooses Ansible's own outright.
"""

from __future__ import annotations

from ansible.plugins.loader import strategy_loader
from ansible.utils.display import Display

_Linear = strategy_loader.get("linear", class_only=True)

try:
    from ansible_mitogen.strategy import StrategyMixin
except ImportError:
    Display().warning("Mitogen is not installed (it comes with gpupool[lab]): running "
                      "Ansible's own linear strategy instead of mitogen_linear")

    class StrategyModule(_Linear):  # type: ignore[valid-type,misc]
        """Ansible's linear strategy, unchanged."""
else:

    class StrategyModule(StrategyMixin, _Linear):  # type: ignore[valid-type,misc]
        """Mitogen's linear strategy (ansible_mitogen/plugins/strategy/mitogen_linear.py)."""
