"""Images (infra/images): ECR repositories and the images the stack builds into them."""

from infra.core.facts import Integration
from infra.images import facts

# The packages of infra this one may import, besides itself (tests/e2e/test_layers.py).
INPUTS = ("core",)
IMAGES = Integration("images", kinds=facts.KINDS, holders=facts.HOLDERS)
