"""The stack's jobs (infra/jobs): the `jobs` and `runtimes` sections of stack config and the plan's
view of the jobs a stack declares (what they run, what they are expected to cost and use).
"""

# The packages of infra this one may import, besides itself (tests/e2e/test_layers.py).
INPUTS = ("core", "karpenter", "storage", "vpc")
