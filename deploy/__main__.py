"""Entry point for `pulumi preview` / `pulumi up` (Pulumi.yaml `main: deploy/`)."""

from deploy.program import main

main()
