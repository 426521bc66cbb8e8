"""The core (infra/core): the contract every integration fulfils (facts.py), the engines that read
it (cost, capacity, replacement, steps, day two), and what every integration shares: config base
types, the component context, the node and pool vocabulary, IAM and Helm helpers, the price
catalog, the offline plan, the version pins (versions.py).
"""

# The packages of infra this one may import, besides itself (tests/e2e/test_layers.py).
INPUTS = ()
