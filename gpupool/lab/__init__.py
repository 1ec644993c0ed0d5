"""The local lab: podman hosts derived from the description, the signed package mirror,
the local AWS endpoint (moto) and the lab Slurm cluster."""
