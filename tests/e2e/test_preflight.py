"""GPU availability preflight against moto's EC2 (zones, offerings, spot prices) and recorded
Service Quotas responses (moto implements Service Quotas for the vpc service only)."""

import json

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from deploy import preflight
from infra.stack.loading import parse_stack_config
from tests.plugin import NO_DEV_SERVERS, stack_values

ACCOUNT = "123456789012"


def config_in(region: str, pools: list[dict], az_count: int = 2):
    values = stack_values("dev", network={"azCount": az_count})
    values["aws:region"] = region
    values["training-platform:nodePools"] = pools
    values["training-platform:jobs"] = []
    values["training-platform:devServers"] = NO_DEV_SERVERS
    return parse_stack_config(values, "Pulumi.test.yaml")


def quota_response(region: str, code: str, value: float) -> dict:
    """GetServiceQuota's response as AWS shapes it."""
    return {
        "Quota": {
            "ServiceCode": "ec2",
            "ServiceName": "Amazon Elastic Compute Cloud (Amazon EC2)",
            "QuotaArn": f"arn:aws:servicequotas:{region}:{ACCOUNT}:ec2/{code}",
            "QuotaCode": code,
            "QuotaName": "vCPU quota",
            "Value": value,
            "Unit": "None",
            "Adjustable": True,
            "GlobalQuota": False,
            "UsageMetric": {
                "MetricNamespace": "AWS/Usage",
                "MetricName": "ResourceCount",
                "MetricDimensions": {"Class": "None", "Resource": "vCPU", "Service": "EC2"},
                "MetricStatisticRecommendation": "Maximum",
            },
        }
    }


def stubbed_quotas(region: str, values: dict[str, float | None]) -> boto3.client:
    """A Service Quotas client answering in code order; None: no applied value (default 0)."""
    client = boto3.client(
        "service-quotas", region_name=region, aws_access_key_id="x", aws_secret_access_key="x"
    )
    stubber = Stubber(client)
    for code in sorted(values):
        params = {"ServiceCode": "ec2", "QuotaCode": code}
        if values[code] is None:
            stubber.add_client_error(
                "get_service_quota",
                "NoSuchResourceException",
                http_status_code=404,
                expected_params=params,
            )
            stubber.add_response(
                "get_aws_default_service_quota", quota_response(region, code, 0.0), params
            )
        else:
            stubber.add_response(
                "get_service_quota", quota_response(region, code, values[code]), params
            )
    stubber.activate()
    client.stubber = stubber
    return client


@pytest.fixture
def aws(monkeypatch):
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, "testing")
    with mock_aws():
        yield


def test_quota_buckets_follow_the_family_and_capacity_type():
    assert preflight.quota_bucket("g5.12xlarge", "on-demand").code == "L-DB2E81BA"
    assert preflight.quota_bucket("g6e.xlarge", "spot").code == "L-3819A6DF"
    assert preflight.quota_bucket("p4d.24xlarge", "on-demand").code == "L-417A185B"
    assert preflight.quota_bucket("p4d.24xlarge", "spot").code == "L-7212CCBC"
    assert preflight.quota_bucket("p5.48xlarge", "on-demand").code == "L-417A185B"
    assert preflight.quota_bucket("p5en.48xlarge", "spot").code == "L-C4BD4855"
    assert preflight.quota_bucket("m6i.large", "on-demand").code == "L-1216C47A"
    assert preflight.quota_bucket("c7i.xlarge", "spot").code == "L-34B43A08"
    with pytest.raises(ValueError, match="no EC2 vCPU quota bucket"):
        preflight.quota_bucket("inf2.xlarge", "spot")


def test_ceilings_add_up_per_quota_bucket():
    config = config_in(
        "us-west-2",
        [
            {
                "name": "a",
                "instanceTypes": ["p4d.24xlarge"],
                "maxNodes": 2,
                "capacityTypes": ["spot", "on-demand"],
            },
            {"name": "b", "instanceTypes": ["p5.48xlarge"], "maxNodes": 1},
            {"name": "c", "instanceTypes": ["g5.xlarge", "g5.12xlarge"], "maxNodes": 3},
        ],
    )
    needed = {b.code: users for b, users in preflight.vcpu_needed(config).items()}
    assert needed["L-417A185B"] == {"a": 192, "b": 192}  # P on-demand: p4d and p5 share it
    assert needed["L-7212CCBC"] == {"a": 192}
    assert needed["L-DB2E81BA"] == {"c": 3 * 48}  # the largest type of the pool
    assert needed["L-1216C47A"] == {"system node group": 3 * 2}  # maxSize x m6i.large
    assert "L-C4BD4855" not in needed  # b is on-demand only


def test_unsatisfiable_pool_is_reported_and_fails(aws):
    # moto's eu-west-1 offers p4d.24xlarge only in eu-west-1c; the stack uses a and b.
    config = config_in(
        "eu-west-1",
        [
            {
                "name": "gpu-large",
                "instanceTypes": ["p4d.24xlarge"],
                "maxNodes": 1,
                "capacityTypes": ["on-demand"],
            }
        ],
    )
    quotas = stubbed_quotas("eu-west-1", {"L-1216C47A": 64, "L-417A185B": None})
    report = preflight.preflight(config, boto3.client("ec2", region_name="eu-west-1"), quotas)
    quotas.stubber.assert_no_pending_responses()
    assert "gpu-large: p4d.24xlarge not offered in eu-west-1a, eu-west-1b" in report.warnings
    assert "gpu-large: none of p4d.24xlarge is offered in eu-west-1a, eu-west-1b" in report.problems
    assert (
        "gpu-large: quota 0 vCPU of 96 needed (L-417A185B Running On-Demand P instances)"
        in report.problems
    )
    assert len(report.problems) == 2


def test_satisfiable_stack_passes_with_spot_prices(aws):
    config = config_in(
        "us-east-1",
        [
            {
                "name": "gpu",
                "instanceTypes": ["p4de.24xlarge"],
                "maxNodes": 2,
                "capacityTypes": ["spot"],
            },
            {"name": "cpu", "instanceTypes": ["m6i.2xlarge"], "maxNodes": 4},
        ],
    )
    quotas = stubbed_quotas("us-east-1", {"L-1216C47A": 64, "L-7212CCBC": 192})
    report = preflight.preflight(config, boto3.client("ec2", region_name="us-east-1"), quotas)
    assert report.problems == []
    # moto's us-east-1 offers p4de.24xlarge in 1b and 1c only: narrower, still satisfiable.
    assert report.warnings == ["gpu: p4de.24xlarge not offered in us-east-1a"]
    assert any(
        n.startswith("gpu: p4de.24xlarge spot $") and "in us-east-1b" in n for n in report.notes
    )
    assert "system node group, cpu: quota 64 vCPU of 38 needed" in " ".join(report.notes)


@pytest.mark.parametrize(
    ("zone", "az_count", "found"),
    [
        # moto's eu-west-1 offers p4d.24xlarge only in eu-west-1c.
        ("eu-west-1a", 3, ("ERROR", "p4d.24xlarge not offered in eu-west-1a, the pool's zone")),
        (
            "eu-west-1c",
            2,
            (
                "ERROR",
                "availabilityZone eu-west-1c has no subnet of this stack (eu-west-1a, eu-west-1b)",
            ),
        ),
        ("eu-west-1c", 3, ("ok", "p4d.24xlarge offered in eu-west-1c, the pool's zone")),
    ],
)
def test_efa_pool_fails_unless_its_type_is_offered_in_its_zone(aws, zone, az_count, found):
    pool = {
        "name": "efa",
        "instanceTypes": ["p4d.24xlarge"],
        "maxNodes": 1,
        "efa": True,
        "availabilityZone": zone,
    }
    config = config_in("eu-west-1", [pool], az_count)
    quotas = stubbed_quotas("eu-west-1", {"L-1216C47A": 64, "L-417A185B": 96})
    report = preflight.preflight(config, boto3.client("ec2", region_name="eu-west-1"), quotas)
    level, text = found
    assert f"efa: {text}" in (report.problems if level == "ERROR" else report.notes)
    assert bool(report.problems) == (level == "ERROR")
    assert not report.warnings  # an EFA pool's other zones are not its business


def test_spot_only_pool_without_a_spot_market_fails(aws):
    # moto prices spot only where a type is offered: eu-west-1 has p4d.24xlarge in 1c only.
    config = config_in(
        "eu-west-1",
        [
            {
                "name": "a100",
                "instanceTypes": ["p4d.24xlarge"],
                "maxNodes": 1,
                "capacityTypes": ["spot"],
            }
        ],
    )
    quotas = stubbed_quotas("eu-west-1", {"L-1216C47A": 64, "L-7212CCBC": 96})
    report = preflight.preflight(config, boto3.client("ec2", region_name="eu-west-1"), quotas)
    assert (
        "a100: no spot price for p4d.24xlarge in eu-west-1a, eu-west-1b during the last 1 day(s)"
        in report.problems
    )


def test_cli_exit_code_and_output(aws, monkeypatch, capsys):
    region = "us-west-2"  # Pulumi.dev.yaml's region
    codes = ["L-1216C47A", "L-34B43A08", "L-417A185B", "L-7212CCBC", "L-DB2E81BA"]
    quotas = stubbed_quotas(region, dict.fromkeys(codes, 0.0) | {"L-1216C47A": 1000.0})
    monkeypatch.setattr(
        preflight, "aws_clients", lambda r: (boto3.client("ec2", region_name=r), quotas)
    )
    assert preflight.main(["--stack", "dev"]) == 1
    out = capsys.readouterr().out
    assert "ERROR gpu-large: quota 0 vCPU of 1536 needed (L-417A185B" in out
    assert "ERROR gpu-small: quota 0 vCPU of 192 needed (L-DB2E81BA" in out
    assert "ok    system node group, cpu: quota 1000 vCPU of 166 needed" in out


def test_cli_names_a_missing_stack(capsys):
    assert preflight.main(["--stack", "nope"]) == 2
    assert "allowed stacks: dev, prod" in capsys.readouterr().err


def addon_versions(name: str, version: str, builds: dict[str, bool]) -> dict:
    """DescribeAddonVersions' answer as EKS shapes it: each build with its compatibilities."""
    return {
        "addons": [
            {
                "addonName": name,
                "type": "networking",
                "addonVersions": [
                    {
                        "addonVersion": build,
                        "architecture": ["amd64", "arm64"],
                        "compatibilities": [
                            {
                                "clusterVersion": version,
                                "platformVersions": ["*"],
                                "defaultVersion": default,
                            }
                        ],
                    }
                    for build, default in builds.items()
                ],
            }
        ]
    }


def test_pinned_add_on_builds_are_checked_against_what_eks_offers():
    config = parse_stack_config(stack_values("dev"), "Pulumi.dev.yaml")
    version = config.cluster.kubernetes_version
    pinned = preflight.stack_addons(config)
    assert "aws-fsx-csi-driver" not in pinned and "aws-efs-csi-driver" in pinned
    eks = boto3.client(
        "eks", region_name="us-west-2", aws_access_key_id="x", aws_secret_access_key="x"
    )
    stubber = Stubber(eks)
    for name, build in sorted(pinned.items()):
        builds = {"v9.9.9-eksbuild.1": True}
        if name == "coredns":
            builds = {build: False, "v9.9.9-eksbuild.1": True}  # offered, not the default
        elif name != "kube-proxy":
            builds = {build: True}
        stubber.add_response(
            "describe_addon_versions",
            addon_versions(name, version, builds),
            {"addonName": name, "kubernetesVersion": version},
        )
    stubber.activate()
    report = preflight.Report()
    preflight.check_addons(config, eks, report)
    stubber.assert_no_pending_responses()
    (problem,) = report.problems
    assert problem.startswith(f"add-on kube-proxy {pinned['kube-proxy']} is not offered")
    assert "(EKS's default there is v9.9.9-eksbuild.1)" in problem
    assert f"add-on coredns: pinned {pinned['coredns']}; EKS's default" in " ".join(report.notes)


@pytest.mark.parametrize("version", ["1.36", "1.37"])
def test_the_ami_release_is_checked_for_the_stacks_kubernetes_version(version):
    """Karpenter finds an alias's AMIs through SSM parameters named after the version and the
    release: a release without them for the version launches no node."""
    config = parse_stack_config(
        stack_values("dev", cluster={"kubernetesVersion": version}), "Pulumi.dev.yaml"
    )
    standard, nvidia = preflight.ami_parameters(config)
    release = config.karpenter.ami_alias.split("@")[1]
    assert standard == (
        f"/aws/service/eks/optimized-ami/{version}/amazon-linux-2023/x86_64/standard/"
        f"amazon-eks-node-al2023-x86_64-standard-{version}-{release}/image_id"
    )
    ssm = boto3.client(
        "ssm", region_name="us-west-2", aws_access_key_id="x", aws_secret_access_key="x"
    )
    stubber = Stubber(ssm)
    stubber.add_response(
        "get_parameter", {"Parameter": {"Name": standard, "Value": "ami-1"}}, {"Name": standard}
    )
    stubber.add_client_error("get_parameter", "ParameterNotFound", expected_params={"Name": nvidia})
    stubber.activate()
    report = preflight.Report()
    preflight.check_ami(config, ssm, report)
    stubber.assert_no_pending_responses()
    (problem,) = report.problems
    assert f"has no AMI for Kubernetes {version} ({nvidia} does not exist)" in problem


def configuration_schema(properties: dict) -> dict:
    """DescribeAddonConfiguration's answer: the build's schema as a JSON string."""
    schema = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object"}
    return {
        "addonName": "x",
        "addonVersion": "x",
        "configurationSchema": json.dumps({**schema, "properties": properties}),
    }


def test_the_csi_add_ons_configuration_keys_are_checked_against_each_builds_schema():
    """CreateAddon refuses a key outside the build's configuration schema: the FSx node agent's
    affinity (which keeps it off the hybrid machines) and EBS's disableMutation are confirmed
    before `pulumi up`, not discovered half-way through it."""
    values = stack_values("dev", storage={"fsx": {"enabled": True}})
    config = parse_stack_config(values, "Pulumi.dev.yaml")
    pinned = preflight.stack_addons(config)
    eks = boto3.client(
        "eks", region_name="us-west-2", aws_access_key_id="x", aws_secret_access_key="x"
    )
    stubber = Stubber(eks)
    ebs = {
        "controller": {"properties": {"nodeSelector": {"type": "object"}}},
        "node": {"properties": {"serviceAccount": {"properties": {"disableMutation": {}}}}},
    }
    # An FSx build whose schema has node.tolerations but no node.affinity.
    fsx = {"node": {"properties": {"tolerations": {"type": "array"}}}}
    for name, properties in (("aws-ebs-csi-driver", ebs), ("aws-fsx-csi-driver", fsx)):
        stubber.add_response(
            "describe_addon_configuration",
            configuration_schema(properties),
            {"addonName": name, "addonVersion": pinned[name]},
        )
    stubber.activate()
    report = preflight.Report()
    preflight.check_addon_configuration(config, eks, report)
    stubber.assert_no_pending_responses()
    assert report.problems == [
        f"add-on aws-fsx-csi-driver {pinned['aws-fsx-csi-driver']} has no configuration key "
        "node.affinity: CreateAddon would refuse the platform's configuration "
        "(infra/storage/csi_addons.py says what it is for)"
    ]
