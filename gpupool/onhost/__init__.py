"""Programs copied to and run on pool hosts (the burst resume/suspend program, the GPU
burn-in, the reference training job). They import nothing of gpupool but each other
(prom_textfile, the root textfile writer, copied beside its users): a host has only the
Python standard library (and boto3 for the burst program, prometheus_client for the
textfile writers)."""
