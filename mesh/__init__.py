"""Light mode: GPUs outside AWS train together over a WireGuard mesh with torchrun, no cluster.

`tp-mesh` (mesh/cli.py) reads a mesh file (mesh/example.yaml), writes WireGuard hub-and-spoke
configs, checks every node over SSH and launches the same torchrun command on all of them.
"""
