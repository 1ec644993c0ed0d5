"""The acceptance gate: tiered testinfra suites whose machine-readable verdict decides
whether a node joins the pool (and whether it stays)."""
