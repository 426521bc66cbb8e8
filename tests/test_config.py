"""Stack config validation: good stacks parse, bad ones fail with one message naming the key."""

import json
import re
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infra.config import ConfigError, load_stack_file, parse_stack_config, read_stack_file
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
            "allowed: an IAM role or user ARN",
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


POOL = {"name": "cpu", "instanceTypes": ["m6i.2xlarge"], "maxNodes": 2}


@pytest.mark.parametrize(
    ("sections", "key_path", "allowed"),
    [
        ({"nodePools": [{**POOL, "maxNodes": True}]}, "nodePools[cpu].maxNodes", "valid integer"),
        ({"nodePools": [{**POOL, "maxNodes": "2"}]}, "nodePools[cpu].maxNodes", "valid integer"),
        ({"cluster": {"name": "TP-Dev"}}, "cluster.name", "no uppercase"),
        ({"cluster": {"name": "tp--dev"}}, "cluster.name", "'--'"),
        ({"cluster": {"name": "tp-dev-"}}, "cluster.name", "trailing '-'"),
        ({"cluster": {"name": "a" * 45}}, "cluster", "KarpenterController-"),
        (
            {"cluster": {"adminPrincipalArns": ["arn:aws:iam::123456789012:role/a"] * 2}},
            "cluster",
            "each ARN once",
        ),
        (
            {
                "network": {
                    "existingVpc": {
                        "vpcId": "vpc-0123abcd",
                        "privateSubnetIds": ["subnet-0123abcd", "subnet-0123abcd"],
                    }
                }
            },
            "network.existingVpc",
            "each subnet once",
        ),
        ({"queues": {"teams": [{"name": "kube-system"}]}}, "queues", "system namespace"),
        ({"queues": {"teams": [{"name": "a", "namespace": "kubeflow"}]}}, "queues", "kubeflow"),
        ({"network": {"cidr": "127.0.0.0/16"}}, "network", "loopback"),
        ({"network": {"cidr": "169.254.0.0/16"}}, "network", "link-local"),
        ({"network": {"cidr": "224.0.0.0/16"}}, "network", "multicast"),
        ({"network": {"privateSubnetCidrs": []}}, "network.privateSubnetCidrs", "at least 1"),
        ({"storage": {"fsx": {"datasetPrefix": "a/../b"}}}, "storage.fsx", ". or .."),
        ({"storage": {"fsx": {"datasetPrefix": "checkpoints/x"}}}, "storage.fsx", "checkpoint"),
        ({"policy": {"productionStacks": []}}, "policy", "includes prod"),
        ({"policy": {"budgetUsdPerHour": float("inf")}}, "policy.budgetUsdPerHour", "finite"),
        ({"nodePools": [{**POOL, "expireAfter": "100000h"}]}, "nodePools[cpu]", "1h to 2160h"),
        ({"nodePools": [{**POOL, "expireAfter": "1m"}]}, "nodePools[cpu]", "1h to 2160h"),
        ({"nodePools": [{**POOL, "name": f"p{i}"} for i in range(65)]}, "nodePools", "64"),
        ({"nodePools": []}, "nodePools", "at least one pool"),
        ({"nodePools": [{**POOL, "instanceTypes": ["m6i.large"]}]}, "nodePools[cpu]", "larger"),
        ({"network": {"cidrr": "10.0.0.0/16"}}, "network.cidrr", "did you mean 'cidr'?"),
    ],
)
def test_what_aws_or_kubernetes_would_refuse_is_a_config_error(sections, key_path, allowed):
    message = error_for(**sections)
    line = next(
        (x for x in message.splitlines() if x.strip().startswith(f"training-platform:{key_path}:")),
        message,
    )
    assert allowed in line, message


@pytest.mark.parametrize(
    ("job", "expected"),
    [
        ({"name": "default"}, "jobs[default]: a job named default"),
        ({"args": ["--help"]}, "jobs[smoke-cpu].args: unrecognized arguments: --help"),
        ({"args": ["-h"]}, "jobs[smoke-cpu].args: unrecognized arguments: -h"),
        ({"args": ["--lr", "nan"]}, "jobs[smoke-cpu].args: --lr nan; allowed: a finite"),
        ({"args": ["--warmup", "-3"]}, "jobs[smoke-cpu].args: --warmup -3; allowed: a finite"),
        ({"args": ["--weight-decay", "inf"]}, "args: --weight-decay inf; allowed: a finite"),
        ({"nodePool": "cpuu"}, "jobs[smoke-cpu].nodePool: 'cpuu' is not a node pool; did you mean"),
        (
            {"queue": "team-aa"},
            "jobs[smoke-cpu].queue: 'team-aa' is not a team queue; did you mean",
        ),
        ({"queue": "research", "maxNodes": 10, "nodePool": "gpu-large"}, "queue can admit at most"),
    ],
)
def test_job_errors_name_the_job(job, expected):
    values = stack_values("dev")
    jobs = values["training-platform:jobs"]
    values["training-platform:jobs"] = [{**jobs[2], **job}]
    with pytest.raises(ConfigError) as caught:
        parse_stack_config(values, "Pulumi.dev.yaml")
    assert expected in str(caught.value)


def test_every_derived_iam_role_name_fits_for_the_longest_names_config_allows():
    from infra.config import (
        AUTONAME_SUFFIX,
        IAM_ROLE_NAME_MAX,
        job_role_resource_name,
        karpenter_role_names,
    )

    longest_job = "j" * 40  # K8sName
    assert len(job_role_resource_name(longest_job)) + AUTONAME_SUFFIX <= IAM_ROLE_NAME_MAX
    accepted = "a" * 44
    values = stack_values("dev", cluster={"name": accepted})
    assert parse_stack_config(values, "Pulumi.dev.yaml").cluster.name == accepted
    assert max(map(len, karpenter_role_names(accepted).values())) == IAM_ROLE_NAME_MAX


def test_no_pools_and_no_teams_never_says_allowed_nothing():
    message = error_for(nodePools=[], queues={"teams": []})
    assert "allowed: none yet" in message
    assert not re.search(r"allowed( keys here)?: *($|;)", message, re.M), message


def test_non_string_keys_are_a_config_error():
    values = stack_values("dev")
    values["training-platform:network"] = {1: "a", None: 2}
    with pytest.raises(ConfigError, match=r"network: key 1 is not a string"):
        parse_stack_config(values, "Pulumi.dev.yaml")


def write_stack(tmp_path, text: str | bytes) -> Path:
    path = tmp_path / "Pulumi.x.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("config:\n  aws:region: us-west-2\n  aws:region: us-east-1\n", "duplicate key"),
        ("config:\n  a: {b: 1, b: 2}\n", "duplicate key"),
        ("config: [\n", "not YAML"),
        (b"config: \xff\xfe\n", "not UTF-8"),
        ("config:\n  ? [a]\n  : 1\n", "plain value"),
        ("- 1\n", "`config` must be a mapping"),
    ],
)
def test_yaml_problems_name_the_file(tmp_path, text, expected):
    write_stack(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        read_stack_file("x", tmp_path)
    assert "Pulumi.x.yaml" in str(caught.value) and expected in str(caught.value)


def test_the_running_stacks_file_is_checked_for_duplicate_keys(tmp_path, monkeypatch):
    import pulumi

    import infra.config

    write_stack(tmp_path, "config:\n  aws:region: us-west-2\n  aws:region: us-east-1\n")
    monkeypatch.setattr(infra.config, "PROJECT_DIR", tmp_path)
    monkeypatch.setattr(pulumi, "get_stack", lambda: "x")
    with pytest.raises(ConfigError, match="Pulumi.x.yaml.*duplicate key"):
        infra.config.config_from_pulumi()


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
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=8) | st.integers(0, 3) | st.none(), inner, max_size=3)
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


ALLOWED_NOTHING = re.compile(r"allowed( keys here)?: *($|;)")


def assert_clear_config_error(error: ConfigError, source: str) -> None:
    lines = str(error).splitlines()
    assert lines[0] == f"Invalid stack config in {source}:", lines
    assert lines[1:] and all(
        line.startswith(("  training-platform:", "  aws:")) for line in lines[1:]
    ), lines
    assert not any(ALLOWED_NOTHING.search(line) for line in lines), lines


# Together with the YAML fuzz below: 1200 generated configs per run, none may raise anything but
# ConfigError (the number is what the issue asks: at least 500 per `make test`).
@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
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
        assert_clear_config_error(e, "Pulumi.prod.yaml")


PROD_TEXT = yaml.safe_dump({"config": stack_values("prod")}, sort_keys=False)
yaml_scalars = st.sampled_from(
    [
        "",
        "null",
        "true",
        "~",
        "1",
        "-1",
        "1e999",
        ".nan",
        "[]",
        "{}",
        "[a",
        "x: y",
        "&a",
        "*a",
        "!!binary AA==",
        "? x",
        "- - 1",
        "'",
        "0x10",
        "2026-01-01",
        "\t",
        "key: value: other",
    ]
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    line=st.integers(0, PROD_TEXT.count("\n")),
    edit=st.sampled_from(["replace-value", "insert", "duplicate", "delete"]),
    scalar=yaml_scalars,
)
def test_edited_stack_files_give_only_the_clear_config_error(line, edit, scalar):
    lines = PROD_TEXT.splitlines()
    line = min(line, len(lines) - 1)
    target = lines[line]
    if edit == "replace-value" and ":" in target:
        lines[line] = target.split(":", 1)[0] + ": " + scalar
    elif edit == "insert":
        indent = len(target) - len(target.lstrip())
        lines.insert(line, " " * indent + scalar)
    elif edit == "duplicate":
        lines.insert(line, target)
    else:
        del lines[line]
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "Pulumi.prod.yaml").write_text("\n".join(lines) + "\n")
        try:
            values = read_stack_file("prod", Path(tmp))
        except ConfigError as e:
            assert "Pulumi.prod.yaml" in str(e)
            return
    try:
        parse_stack_config(values, "Pulumi.prod.yaml")
    except ConfigError as e:
        assert_clear_config_error(e, "Pulumi.prod.yaml")
