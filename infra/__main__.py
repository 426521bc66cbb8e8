"""Entry point for `pulumi preview` / `pulumi up` (Pulumi.yaml `main: infra/`)."""

from infra.program import main

main()
