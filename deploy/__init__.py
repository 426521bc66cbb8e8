"""The composition: the Pulumi program and the commands around it (offline plan, preflight,
hybrid bootstrap pages). It builds on every other folder; none builds on it."""
