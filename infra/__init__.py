"""The gpupool Pulumi program: one ComponentResource per capability, all derived from
the stack's pool description. `infra/__main__.py` is what the Pulumi CLI runs;
`infra.program.declare` is what tests, `gpupool plan` and the benchmark run under mocks."""
