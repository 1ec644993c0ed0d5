"""gpupool's policy pack: guardrails over everything the pool declares.

Policy logic lives in importable modules (one per group); `policies/__main__.py` serves
them as a Pulumi CrossGuard pack and `policies.offline` runs them over what the program
declares under mocks (`gpupool policy`).
"""
