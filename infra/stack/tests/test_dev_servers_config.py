"""Stack config `devServers`: flavors fit their pool, users name a team, one message per bad key."""

import pytest

from infra.core.config import ConfigError
from infra.stack.loading import load_stack_file, parse_stack_config
from tests.plugin import stack_values


def test_dev_stack_declares_flavors_and_users():
    section = load_stack_file("dev").dev_servers
    assert section.enabled
    assert {f.name: f.node_pool for f in section.flavors}["gpu-1"] == "gpu-small"
    assert {u.name: u.team for u in section.users} == {"alice": "team-a", "bob": "research"}


def error_for(dev_servers: dict) -> str:
    values = stack_values("dev")
    values["training-platform:devServers"] = dev_servers
    with pytest.raises(ConfigError) as caught:
        parse_stack_config(values, "Pulumi.dev.yaml")
    return str(caught.value)


USER = {
    "name": "alice",
    "email": "alice@example.com",
    "team": "team-a",
    "iamPrincipalArn": "arn:aws:iam::123456789012:role/dev-alice",
}


@pytest.mark.parametrize(
    ("flavor", "key", "allowed"),
    [
        # g5.12xlarge: 4 GPUs, 48 vCPU, 192 GiB; a pod may ask what a job pod asks (pod_room).
        ({"gpus": 5, "cpu": 8, "memoryGib": 32}, "flavors[f].gpus", "at most 4"),
        ({"gpus": 1, "cpu": 48, "memoryGib": 32}, "flavors[f].cpu", "at most 43"),
        ({"gpus": 1, "cpu": 8, "memoryGib": 180}, "flavors[f].memoryGib", "at most 163"),
        ({"gpus": 0, "cpu": 8, "memoryGib": 32}, "flavors[f].gpus", "CPU-only servers"),
        ({"nodePool": "gpu-huge", "cpu": 8, "memoryGib": 32}, "flavors[f].nodePool", "gpu-small"),
    ],
)
def test_a_flavor_must_fit_its_pools_smallest_instance_type(flavor, key, allowed):
    from infra.stack.loading import load_stack_file

    gpu_small = next(p for p in load_stack_file("dev").node_pools if p.name == "gpu-small")
    assert gpu_small.job_pod_requests() == (43, 163)  # DevServers and jobs: one rule
    message = error_for(
        {"flavors": [{"name": "f", "nodePool": "gpu-small", **flavor}], "users": [USER]}
    )
    assert f"training-platform:devServers.{key}:" in message
    assert allowed in message
    assert "Traceback" not in message


@pytest.mark.parametrize(
    ("patch", "key", "allowed"),
    [
        ({"team": "nobody"}, "users[alice].team", "allowed: team-a, research"),
        ({"email": "alice"}, "users[alice].email", "does not match"),
        ({"iamPrincipalArn": "alice"}, "users[alice].iamPrincipalArn", "does not match"),
        ({"quota": {"gpus": -1}}, "users[alice].quota.gpus", "greater than or equal to 0"),
        ({"quota": {"homeGib": 0}}, "users[alice].quota.homeGib", "greater than or equal to 1"),
        ({"quota": {"cpu": 0}}, "users[alice].quota.cpu", "greater than or equal to 1"),
        ({"quota": {"cpu": 3}}, "users[alice].quota.cpu", "allowed: at least 4"),
        ({"quota": {"memoryGib": 8}}, "users[alice].quota.memoryGib", "allowed: at least 16"),
        ({"quota": {"memoryGib": "16Gi"}}, "users[alice].quota.memoryGib", "integer"),
        ({"name": "Alice"}, "users[0].name", "does not match"),
    ],
)
def test_users_are_checked_key_by_key(patch, key, allowed):
    flavor = {"name": "cpu-small", "nodePool": "cpu", "cpu": 4, "memoryGib": 16}
    message = error_for({"flavors": [flavor], "users": [{**USER, **patch}]})
    assert f"training-platform:devServers.{key}:" in message
    assert allowed in message


@pytest.mark.parametrize(
    ("entry", "allowed"),
    [
        ("ghcr.io/my-org", True),
        ("123456789012.dkr.ecr.us-west-2.amazonaws.com/team-images", True),
        ("localhost:5000", True),
        ("docker.io/library", True),
        ("ubuntu", False),  # a Docker Hub repository, not a registry: docker.io/library/ubuntu
        ("ghcr.io/my-org:latest", False),  # no tags or digests: a registry or a path
        ("ghcr.io/My-Org", False),
        ("ghcr.io/", False),
    ],
)
def test_allowed_image_registries_are_registries_with_an_optional_path(entry, allowed):
    flavor = {"name": "cpu-small", "nodePool": "cpu", "cpu": 4, "memoryGib": 16}
    section = {"flavors": [flavor], "users": [USER], "allowedImageRegistries": [entry]}
    if allowed:
        values = stack_values("dev")
        values["training-platform:devServers"] = section
        config = parse_stack_config(values, "Pulumi.dev.yaml").dev_servers
        assert config.allowed_image_registries == [entry]
    else:
        message = error_for(section)
        assert "devServers.allowedImageRegistries[0]:" in message
        assert "a registry host, optionally with a repository path" in message


def test_names_repeat_and_enabled_without_flavors_are_errors():
    assert "allowed: unique names" in error_for({"users": [USER, USER]})
    assert "devServers.flavors: empty" in error_for({"enabled": True, "users": [USER]})
    assert "allowed keys here:" in error_for({"flavours": []})


@pytest.mark.parametrize(
    ("idle", "key", "allowed"),
    [
        ({"gpuPercent": 101}, "idle.gpuPercent", "less than or equal to 100"),
        ({"cpuPercent": -1}, "idle.cpuPercent", "greater than or equal to 0"),
        ({"gpuPercent": "5%"}, "idle.gpuPercent", "integer"),
        (
            {"memoryPercent": 5},
            "idle.memoryPercent",
            "allowed keys here: countedStopHours, cpuPercent, gpuPercent",
        ),
    ],
)
def test_idle_floors_are_percentages(idle, key, allowed):
    section = stack_values("dev")["training-platform:devServers"]
    message = error_for({**section, "idle": idle})
    assert f"training-platform:devServers.{key}:" in message
    assert allowed in message
