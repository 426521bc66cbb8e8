"""The stack file (infra/stack): every section composed into one StackConfig, the checks between
sections, and reading it from Pulumi config or a stack file.
"""

# The packages of infra this one may import, besides itself (tests/e2e/test_layers.py).
INPUTS = (
    "billing",
    "core",
    "eks",
    "hybrid",
    "images",
    "jobs",
    "karpenter",
    "kueue",
    "storage",
    "vpc",
)
