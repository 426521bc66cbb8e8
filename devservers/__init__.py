"""DevServers: self-service development servers on the cluster (CRDs, operator, devctl)."""
