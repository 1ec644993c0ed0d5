"""Renderers: a valid Description in, plain data out for each target (cloud names and
tags, network flows, the scheduling model, Slurm files, Kubernetes objects, the Ansible
inventory, the summary). Pure functions over the spec layer; no I/O."""
