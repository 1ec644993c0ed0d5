"""Offline views of what would be applied: the Pulumi program run under mocks (plan)
and manifests validated against the real API schemas. No cloud, no Pulumi CLI."""
