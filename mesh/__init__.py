"""Light mode: GPUs outside AWS train together with torchrun, no cluster.

`tp-mesh` (mesh/cli.py) reads a mesh file (mesh/example.yaml): over its own WireGuard (a full
mesh between machines with an endpoint, the coordinator relaying for the others, mesh/layout.py)
or a tailnet the machines are on already; it checks every node over SSH, copies a workdir and
runs a setup on each, and launches the same torchrun command on all of them.
"""
