"""Teams (infra/teams): each team's namespace, access, job identity, image repository and network
fences.
"""

# The packages of infra this one may import, besides itself (tests/e2e/test_layers.py).
INPUTS = ("core", "images", "jobs", "kueue", "storage")
