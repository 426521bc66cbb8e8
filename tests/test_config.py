"""Stack config validation: good stacks parse, bad ones fail with one message naming the key."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infra.config import ConfigError, load_stack_file, parse_stack_config
from tests.conftest import STACKS, stack_values


@pytest.mark.parametrize("stack", STACKS)
def test_stack_files_parse(stack):
    config = load_stack_file(stack)
    assert config.cluster.name == f"tp-{stack}"


def test_prod_is_production_shaped():
    prod = load_stack_file("prod")
    assert prod.network.az_count == 3
    assert prod.network.nat_gateways == "perAz"
    assert all(str(c) != "0.0.0.0/0" for c in prod.cluster.endpoint.public_access_cidrs)
    assert prod.cluster.deletion_protection


def error_for(**sections) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_stack_config(stack_values("dev", **sections), "Pulumi.dev.yaml")
    return str(caught.value)


@pytest.mark.parametrize(
    ("sections", "key_path", "allowed"),
    [
        ({"network": {"azCount": "three"}}, "training-platform:network.azCount", "valid integer"),
        (
            {"network": {"azCount": 5}},
            "training-platform:network.azCount",
            "less than or equal to 3",
        ),
        (
            {"network": {"cidrr": "10.0.0.0/16"}},
            "training-platform:network.cidrr",
            "allowed keys here: azCount, cidr",
        ),
        (
            {"network": {"cidr": "10.0.0.300/16"}},
            "training-platform:network.cidr",
            "such as 10.0.0.0/16",
        ),
        ({"network": {"cidr": "10.0.0.0/8"}}, "training-platform:network", "allowed: /16 to /20"),
        (
            {"network": {"natGateways": "many"}},
            "training-platform:network.natGateways",
            "'single' or 'perAz'",
        ),
        (
            {"network": {"privateSubnetCidrs": ["10.20.0.0/19", "10.20.16.0/20"]}},
            "training-platform:network",
            "overlap; allowed: disjoint subnets",
        ),
        (
            {"network": {"privateSubnetCidrs": ["10.20.0.0/19", "10.99.0.0/19"]}},
            "training-platform:network",
            "outside the VPC cidr",
        ),
        (
            {"cluster": {"systemNodeGroup": {"minSize": -1}}},
            "training-platform:cluster.systemNodeGroup.minSize",
            "greater than or equal to 1",
        ),
        (
            {"cluster": {"systemNodeGroup": {"instanceType": "m6i.huge"}}},
            "training-platform:cluster.systemNodeGroup.instanceType",
            "allowed: c6i.2xlarge",
        ),
        (
            {"cluster": {"systemNodeGroup": {"minSize": 3, "desiredSize": 2}}},
            "training-platform:cluster.systemNodeGroup",
            "minSize <= desiredSize <= maxSize",
        ),
        (
            {"cluster": {"endpoint": {"publicAccessCidrs": ["everyone"]}}},
            "training-platform:cluster.endpoint.publicAccessCidrs[0]",
            "IPv4 CIDR",
        ),
        (
            {"cluster": {"endpoint": {"publicAccess": False, "privateAccess": False}}},
            "training-platform:cluster.endpoint",
            "at least one true",
        ),
        (
            {"cluster": {"kubernetesVersion": "1.20"}},
            "training-platform:cluster.kubernetesVersion",
            "'1.34'",
        ),
        (
            {"cluster": {"adminPrincipalArns": ["bob"]}},
            "training-platform:cluster.adminPrincipalArns[0]",
            "should match pattern",
        ),
        ({"cluster": "tp-dev"}, "training-platform:cluster", "must be a mapping"),
        (
            {"clusterr": {}},
            "training-platform:clusterr",
            "allowed keys here: cluster, devServers, hybrid, image, jobs, karpenter, monitoring, "
            "network, nodePools, policy, queues, storage",
        ),
    ],
)
def test_invalid_config_names_key_path_and_what_is_allowed(sections, key_path, allowed):
    message = error_for(**sections)
    line = next(line for line in message.splitlines() if line.strip().startswith(key_path + ":"))
    assert allowed in line, message


def test_missing_region_is_a_config_error():
    values = stack_values("dev")
    del values["aws:region"]
    with pytest.raises(ConfigError, match="aws:region: missing"):
        parse_stack_config(values, "Pulumi.dev.yaml")


def test_structured_config_arrives_as_json_strings_from_the_engine():
    values = {
        k: json.dumps(v) if isinstance(v, dict) else v for k, v in stack_values("prod").items()
    }
    assert parse_stack_config(values, "Pulumi.prod.yaml") == load_stack_file("prod")


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=True)
    | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


def _paths(value, prefix=()):
    """Every key path into a nested mapping/list value."""
    yield prefix
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            yield from _paths(child, (*prefix, i))


def _replace(value, path, new):
    if not path:
        return new
    head, *rest = path
    copy = list(value) if isinstance(value, list) else dict(value)
    copy[head] = _replace(value[head], rest, new)
    return copy


PROD = {
    k.split(":", 1)[1]: v
    for k, v in stack_values("prod").items()
    if k.startswith("training-platform:")
}
PROD_PATHS = [p for p in _paths(PROD) if p]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    path=st.sampled_from(PROD_PATHS),
    new=json_values,
    extra_key=st.none() | st.text(min_size=1, max_size=8),
)
def test_malformed_config_gives_only_the_clear_config_error(path, new, extra_key):
    broken = _replace(PROD, path, new)
    if extra_key is not None and isinstance(broken.get(path[0]), dict):
        broken[path[0]] = {**broken[path[0]], extra_key: new}
    values = {"aws:region": "us-west-2", **{f"training-platform:{k}": v for k, v in broken.items()}}
    try:
        parse_stack_config(values, "Pulumi.prod.yaml")
    except ConfigError as e:
        lines = str(e).splitlines()
        assert lines[0] == "Invalid stack config in Pulumi.prod.yaml:"
        assert lines[1:] and all(
            line.startswith(("  training-platform:", "  aws:")) for line in lines[1:]
        )
