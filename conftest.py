"""The suite's fixtures and hooks (tests/plugin.py) for every test folder: tests/ and the tests
beside each package (infra/<integration>/tests, workloads/tests, devservers/tests)."""

pytest_plugins = ["tests.plugin"]
