"""Programs copied to and run on pool hosts (the burst resume/suspend program, the GPU
burn-in, the reference training job). They import nothing of gpupool: a host has only
the Python standard library (and boto3 for the burst program)."""
