"""Stack config validation: good stacks parse, bad ones fail with one message naming the key."""

import datetime
import json
import re
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devservers.api import NAMESPACE_PREFIX
from infra.core.config import ConfigError
from infra.core.versions import KARPENTER_AMI_ALIAS
from infra.kueue.config import USER_NAMESPACE_PREFIX
from infra.stack.loading import load_stack_file, parse_stack_config, read_stack_file
from tests.plugin import STACKS, stack_values


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
            "'1.35' or '1.34'",
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
            "allowed keys here: acknowledgeDataLoss, billing, cluster, devServers, hybrid, image, "
            "jobs, karpenter, monitoring, network, nodePools, policy, queues, runtimes, storage",
        ),
    ],
)
def test_invalid_config_names_key_path_and_what_is_allowed(sections, key_path, allowed):
    message = error_for(**sections)
    line = next(line for line in message.splitlines() if line.strip().startswith(key_path + ":"))
    assert allowed in line, message


POOL = {"name": "cpu", "instanceTypes": ["m6i.2xlarge"], "maxNodes": 2}


def test_a_team_namespace_never_takes_a_devserver_users():
    assert USER_NAMESPACE_PREFIX == NAMESPACE_PREFIX


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
        ({"queues": {"teams": [{"name": "kube-system"}]}}, "queues", "system or DevServer"),
        (
            {"cluster": {"endpoint": {"publicAccessCidrs": [f"8.8.{i}.0/24" for i in range(41)]}}},
            "cluster.endpoint.publicAccessCidrs",
            "at most 40",
        ),
        ({"queues": {"teams": [{"name": "devservers-system"}]}}, "queues", "devservers-system"),
        ({"queues": {"teams": [{"name": "a", "namespace": "dev-carol"}]}}, "queues", "dev-*"),
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
        # The trainer's parser reads each of these as --checkpoint-dir, and the job's would win.
        ({"args": ["--checkpoint-dir", "/x"]}, "--checkpoint-dir is set by the platform"),
        ({"args": ["--checkpoint-dir=/x"]}, "--checkpoint-dir is set by the platform"),
        ({"args": ["--checkpoint-d", "/x"]}, "--checkpoint-dir is set by the platform"),
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
    from infra.eks.config import IAM_ROLE_NAME_MAX, karpenter_role_names
    from infra.jobs.config import AUTONAME_SUFFIX, job_role_resource_name

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


@pytest.mark.parametrize("key", [123, True, None])
def test_a_stack_file_key_the_pulumi_cli_cannot_load_is_refused_not_dropped(key):
    values = stack_values("dev")
    values[key] = "x"
    with pytest.raises(ConfigError, match="the Pulumi CLI cannot load the file"):
        parse_stack_config(values, "Pulumi.dev.yaml")


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

    from infra.stack import loading

    write_stack(tmp_path, "config:\n  aws:region: us-west-2\n  aws:region: us-east-1\n")
    monkeypatch.setattr(loading, "PROJECT_DIR", tmp_path)
    monkeypatch.setattr(pulumi, "get_stack", lambda: "x")
    with pytest.raises(ConfigError, match="Pulumi.x.yaml.*duplicate key"):
        loading.config_from_pulumi()


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


# --- values AWS, Karpenter or Kueue cannot use, though their types are right -----------------


def first_line(message: str, key_path: str) -> str:
    return next(
        (x for x in message.splitlines() if x.strip().startswith(f"training-platform:{key_path}:")),
        message,
    )


PINNED_RELEASE = datetime.datetime.strptime(KARPENTER_AMI_ALIAS, "al2023@v%Y%m%d").date()


@pytest.fixture
def today_is_the_pinned_release(monkeypatch):
    """Today, for the amiAlias check, is the day of the pinned default release: no wall clock."""
    from infra.eks import config as cluster

    monkeypatch.setattr(cluster, "utc_today", lambda: PINNED_RELEASE)


def alias(day: datetime.date) -> str:
    return f"al2023@v{day:%Y%m%d}"


@pytest.mark.parametrize(
    ("value", "allowed"),
    [
        ("al2023@v20231399", "not a calendar date"),
        ("al2023@v99999999", "not a calendar date"),
        ("al2023@v20260230", "not a calendar date"),
        (alias(PINNED_RELEASE + datetime.timedelta(days=2)), "after tomorrow"),
        ("al2023@v20990101", "after tomorrow"),
        # Karpenter looks the alias up per Kubernetes version: no 1.35 AMI is older than this.
        ("al2023@v20260113", "first AL2023 release for Kubernetes 1.35 is v20260114"),
    ],
)
def test_ami_alias_names_a_release_that_can_exist(today_is_the_pinned_release, value, allowed):
    message = error_for(karpenter={"amiAlias": value})
    assert allowed in first_line(message, "karpenter.amiAlias"), message


@pytest.mark.parametrize(
    "day", [PINNED_RELEASE, PINNED_RELEASE + datetime.timedelta(days=1), datetime.date(2026, 1, 14)]
)
def test_ami_alias_of_a_release_up_to_tomorrow_is_accepted(today_is_the_pinned_release, day):
    values = stack_values("dev", karpenter={"amiAlias": alias(day)})
    assert parse_stack_config(values, "Pulumi.dev.yaml").karpenter.ami_alias == alias(day)


@pytest.mark.parametrize(
    "cidr",
    [
        "10.0.0.0/8",
        "10.1.2.0/24",
        "172.16.0.0/12",
        "192.168.1.0/24",
        "100.64.0.0/10",  # carrier-grade NAT (RFC 6598)
        "127.0.0.0/8",
        "169.254.0.0/16",
        "0.0.0.0/8",
        "198.18.0.0/15",
        "224.0.0.0/4",
        "240.0.0.0/4",
    ],
)
def test_endpoint_cidrs_must_be_internet_addresses(cidr):
    message = error_for(cluster={"endpoint": {"publicAccessCidrs": ["81.2.69.0/24", cidr]}})
    line = first_line(message, "cluster.endpoint.publicAccessCidrs[1]")
    assert f"{cidr} is not an internet range" in line and "allowed:" in line, message


@pytest.mark.parametrize(
    "cidrs",
    [
        ["0.0.0.0/0"],
        ["0.0.0.0/1", "128.0.0.0/1"],  # the production guard is the policy pack's (test_policies)
        ["81.2.69.0/24", "8.0.0.0/7"],  # 8.0.0.0/7 holds private 10.0.0.0/8 and public 11/8
        ["203.0.113.0/24"],  # documentation ranges: placeholders, refused at pulumi up
    ],
)
def test_endpoint_cidrs_holding_internet_addresses_are_accepted(cidrs):
    values = stack_values("dev", cluster={"endpoint": {"publicAccessCidrs": cidrs}})
    config = parse_stack_config(values, "Pulumi.dev.yaml")
    assert [str(c) for c in config.cluster.endpoint.public_access_cidrs] == cidrs


def test_not_internet_ranges_are_what_python_calls_not_global():
    """NOT_INTERNET is Python's `is_global` (IANA's special-purpose registry) plus multicast,
    less the documentation ranges (placeholders, refused at pulumi up)."""
    import ipaddress

    from infra.eks.config import NOT_INTERNET
    from infra.stack.policy import DOCUMENTATION_RANGES

    def refused(address):
        return any(address in n for n in NOT_INTERNET)

    for network in NOT_INTERNET:
        for address in (network.network_address, network.broadcast_address):
            assert not address.is_global or address.is_multicast, network
    # Every /16's first and last address, and the small ranges' neighbours: refused exactly
    # where Python calls the address not global.
    probes = [ipaddress.IPv4Address(n << 16 | low) for n in range(1 << 16) for low in (0, 0xFFFF)]
    probes += [ipaddress.IPv4Address(f"192.0.0.{i}") for i in range(256)]
    for address in probes:
        if any(address in doc for doc in DOCUMENTATION_RANGES):
            continue
        assert refused(address) == (not address.is_global or address.is_multicast), address


@pytest.mark.parametrize(
    ("hybrid", "names", "allowed"),
    [
        (False, ["hybrid-gateway"], "allowed: none"),
        (True, ["hybrid-gatway"], "did you mean 'hybrid-gateway'? allowed: hybrid-gateway"),
        (True, ["ssh"], "allowed: hybrid-gateway"),
    ],
)
def test_allowed_public_ingress_names_a_resource_the_stack_opens(hybrid, names, allowed):
    from infra.hybrid.tests.test_hybrid import HYBRID, PRIVATE_ENDPOINT_OFF

    sections = {"policy": {"allowedPublicIngress": names}}
    if hybrid:
        sections["cluster"] = PRIVATE_ENDPOINT_OFF
    values = stack_values("dev", **sections)
    if hybrid:
        values["training-platform:hybrid"] = HYBRID
    with pytest.raises(ConfigError) as caught:
        parse_stack_config(values, "Pulumi.dev.yaml")
    line = first_line(str(caught.value), "policy.allowedPublicIngress[0]")
    assert f"{names[0]!r} is not a resource this stack opens to the internet" in line, line
    assert allowed in line, line


def test_a_stack_with_nothing_to_queue_for_is_refused():
    """Kueue refuses a ClusterQueue without flavors (resourceGroups[].flavors minItems 1 in the
    upstream CRD), and the platform ClusterQueue's flavors are the node pools (and hybrid)."""
    from infra.core.tests.crd_schema import conformance_errors
    from infra.kueue.config import QueuesConfig
    from infra.kueue.queues import cluster_queue_spec
    from tests.plugin import NO_DEV_SERVERS

    empty = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": "platform"},
        "spec": cluster_queue_spec([], QueuesConfig(), {}),
    }
    assert any("flavors" in e for e in conformance_errors(empty))
    message = error_for(nodePools=[], queues={"teams": []}, jobs=[], devServers=NO_DEV_SERVERS)
    assert "ClusterQueue" in first_line(message, "nodePools"), message
