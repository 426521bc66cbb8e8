"""GPU nodes (infra/gpu): the NVIDIA and EFA device plugins, the DCGM exporter and the monitoring
stack, and the watch that reports GPU nodes that never advertise their GPUs.
"""

from infra.core.facts import Integration
from infra.gpu import facts

# The packages of infra this one may import, besides itself (tests/e2e/test_layers.py).
INPUTS = ("core", "eks", "hybrid", "images", "karpenter", "teams")
GPU = Integration("gpu", charts=facts.CHARTS)
