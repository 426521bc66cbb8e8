"""Capacity reservations, static NodePools and topology-aware placement of EFA jobs.

What each rendered object is checked against, upstream's rules rather than our code: the CRDs with
their CEL rules (tests/crds and the written-down Topology, evaluated by
infra/core/tests/crd_schema.py), the Karpenter chart's feature gates and its reference controller
policy (v1.14.1, written down in infra/karpenter/tests/karpenter_rules.py), Kueue's TAS admission
and webhook rules (cited where re-stated), the region's price file, and DescribeCapacityReservations
answers in EC2's shape (botocore Stubber; moto 5.2.5 does not implement the call).
"""

import copy
import re
from datetime import UTC, datetime

import boto3
import pytest
import yaml
from botocore.stub import Stubber

from deploy import preflight
from infra.core.bill import CostLine, Part
from infra.core.catalog import PRICES_DIR, load_prices
from infra.core.config import ConfigError
from infra.core.declared import Declared, declared_in, listed
from infra.core.tests.crd_schema import cel_violations, conformance_errors
from infra.integrations import stack_cost
from infra.karpenter.facts import NODEPOOL
from infra.karpenter.tests import karpenter_rules as karpenter
from infra.karpenter.tests.test_karpenter import statements
from infra.kueue.queues import NETWORK_TOPOLOGY, TOPOLOGY_LEVELS
from infra.stack.loading import parse_stack_config
from tests.e2e.test_conformance import custom_resources
from tests.plugin import NO_DEV_SERVERS, deep_merge, plan_of, stack_values

ODCR = "cr-0a1b2c3d4e5f60718"
RESERVATIONS = [
    {"id": ODCR, "instanceType": "p4d.24xlarge", "instanceCount": 2},
    {
        "tags": {"team": "research", "purpose": "*"},
        "reservationType": "capacity-block",
        "instanceType": "p4d.24xlarge",
        "instanceCount": 1,
        "durationHours": 168,
    },
]
# dev's EFA pool, static and launching into two reservations first.
RESERVED_POOL = {
    "maxNodes": 4,
    "capacityTypes": ["reserved", "on-demand"],
    "staticNodes": True,
    "capacityReservations": RESERVATIONS,
}
TOPOLOGY_JOB = {
    "name": "gpt-large",
    "kind": "PyTorchJob",
    "nodePool": "gpu-large",
    "minNodes": 2,
    "maxNodes": 4,
    "queue": "team-a",
    "args": ["--model", "gpt2-124m", "--steps", "100"],
}


def dev_with(pool_patch: dict, **sections) -> dict:
    """dev's sections with gpu-large patched; DevServers off (Kueue admits none on a topology
    pool) and a PyTorchJob on gpu-large beside dev's MPIJob there."""
    pools = copy.deepcopy(stack_values("dev")["training-platform:nodePools"])
    pools = [deep_merge(p, pool_patch) if p["name"] == "gpu-large" else p for p in pools]
    jobs = stack_values("dev")["training-platform:jobs"] + [TOPOLOGY_JOB]
    return {"nodePools": pools, "devServers": NO_DEV_SERVERS, "jobs": jobs, **sections}


@pytest.fixture(scope="module")
def reserved_plan():
    return plan_of("dev", **dev_with(RESERVED_POOL))


def spec(plan, kind: str, name: str) -> dict:
    (found,) = [
        r.inputs
        for r in custom_resources(plan)
        if r.inputs["kind"] == kind and r.inputs["metadata"]["name"] == name
    ]
    return copy.deepcopy(found)


def requirement(nodepool: dict, key: str) -> list[str]:
    (found,) = [r for r in nodepool["spec"]["template"]["spec"]["requirements"] if r["key"] == key]
    return found["values"]


# --- what the stack file may say ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("patch", "key", "message"),
    [
        (
            {"capacityTypes": ["reserved", "on-demand"], "capacityReservations": []},
            "nodePools[gpu-large]",
            "capacityTypes lists reserved without capacityReservations",
        ),
        (
            {"capacityTypes": ["on-demand"]},
            "nodePools[gpu-large]",
            "capacityReservations is set but capacityTypes lacks reserved",
        ),
        (
            {"capacityReservations": [{**RESERVATIONS[0], "tags": {"a": "b"}}]},
            "nodePools[gpu-large].capacityReservations[0]",
            "needs id or tags, not both",
        ),
        (
            {"capacityReservations": [{**RESERVATIONS[1], "tags": {"team": ""}}]},
            "nodePools[gpu-large].capacityReservations[0]",
            "tags has an empty key or value",
        ),
        (
            {"capacityReservations": [{**RESERVATIONS[0], "id": "cr-NOPE"}]},
            "nodePools[gpu-large].capacityReservations[0].id",
            "does not match",
        ),
        (
            {"capacityReservations": [{**RESERVATIONS[0], "instanceType": "p5.48xlarge"}]},
            "nodePools[gpu-large]",
            "capacityReservations[0].instanceType p5.48xlarge is not one of the pool's",
        ),
        (
            {"capacityReservations": [{**RESERVATIONS[0], "instanceCount": 5}]},
            "nodePools[gpu-large]",
            "hold 5 instances but maxNodes is 4",
        ),
        (
            {"capacityReservations": [RESERVATIONS[0], RESERVATIONS[0]]},
            "nodePools[gpu-large]",
            f"lists {ODCR} more than once",
        ),
        (
            {"capacityTypes": ["reserved"]},
            "nodePools[gpu-large]",
            "capacityTypes is only reserved, whose 3 instances are all Karpenter can launch",
        ),
        (
            {"capacityReservations": [{**RESERVATIONS[1], "reservationType": "block"}]},
            "nodePools[gpu-large].capacityReservations[0].reservationType",
            "'default' or 'capacity-block'",
        ),
    ],
)
def test_bad_reservation_config_is_a_config_error_at_its_key(patch, key, message):
    pool = {**RESERVED_POOL, **patch}
    with pytest.raises(ConfigError) as caught:
        parse_stack_config(stack_values("dev", **dev_with(pool)), "Pulumi.dev.yaml")
    line = next(x for x in str(caught.value).splitlines() if f"training-platform:{key}:" in x)
    assert message in line


def test_dev_servers_may_not_live_on_a_topology_pool():
    sections = dev_with(RESERVED_POOL)
    del sections["devServers"]  # dev's a100-8 flavor is on gpu-large
    with pytest.raises(ConfigError) as caught:
        parse_stack_config(stack_values("dev", **sections), "Pulumi.dev.yaml")
    assert (
        "training-platform:devServers.flavors[a100-8].nodePool: pool gpu-large places pods by "
        "topology (staticNodes), where Kueue admits no DevServer"
    ) in str(caught.value)


# --- Karpenter: what it launches and may launch ------------------------------------------------


def test_reservations_render_into_the_node_class_and_the_reserved_capacity_type(reserved_plan):
    node_class = spec(reserved_plan, "EC2NodeClass", "gpu-large")
    assert node_class["spec"]["capacityReservationSelectorTerms"] == [
        {"id": ODCR},
        {"tags": {"team": "research", "purpose": "*"}},
    ]
    nodepool = spec(reserved_plan, "NodePool", "gpu-large")
    assert requirement(nodepool, "karpenter.sh/capacity-type") == ["reserved", "on-demand"]
    # The EFA pool keeps its one zone and its cluster placement group.
    assert requirement(nodepool, "topology.kubernetes.io/zone") == ["us-west-2a"]
    assert node_class["spec"]["placementGroupSelector"] == {"name": "tp-dev-gpu-large"}
    others = spec(reserved_plan, "EC2NodeClass", "gpu-small")
    assert "capacityReservationSelectorTerms" not in others["spec"]
    assert "annotations" not in others["metadata"]


def test_static_pool_keeps_max_nodes_running_and_max_nodes_still_drives_quota(reserved_plan):
    nodepool = spec(reserved_plan, "NodePool", "gpu-large")["spec"]
    assert nodepool["replicas"] == 4
    assert nodepool["limits"] == {"nodes": "4"}  # a static NodePool takes no other limit
    (queue,) = [
        r.inputs
        for r in custom_resources(reserved_plan)
        if r.inputs["kind"] == "ClusterQueue" and r.inputs["metadata"]["name"] == "platform"
    ]
    (flavor,) = [
        f for f in queue["spec"]["resourceGroups"][0]["flavors"] if f["name"] == "gpu-large"
    ]
    # 4 x p4d.24xlarge: 8 GPUs, 96 vCPU, 1152 GiB each.
    assert {r["name"]: r["nominalQuota"] for r in flavor["resources"]} == {
        "cpu": "384",
        "memory": "4608Gi",
        "nvidia.com/gpu": "32",
    }


def test_every_custom_resource_of_a_reserved_static_stack_passes_its_crd_and_cel_rules(
    reserved_plan,
):
    resources = custom_resources(reserved_plan)
    assert {"Topology", "EC2NodeClass", "NodePool", "ResourceFlavor"} <= {
        r.inputs["kind"] for r in resources
    }
    failures = {r.name: conformance_errors(r.inputs) + cel_violations(r.inputs) for r in resources}
    assert {name: errors for name, errors in failures.items() if errors} == {}


def _term(manifest, term):
    manifest["spec"]["capacityReservationSelectorTerms"] = [term]


@pytest.mark.parametrize(
    ("kind", "name", "mutate", "expected"),
    [
        (
            "EC2NodeClass",
            "gpu-large",
            lambda m: _term(m, {"id": ODCR, "tags": {"a": "b"}}),
            "'id' is mutually exclusive",
        ),
        (
            "EC2NodeClass",
            "gpu-large",
            lambda m: _term(m, {"ownerID": "123456789012"}),
            "expected at least one",
        ),
        (
            "EC2NodeClass",
            "gpu-large",
            lambda m: _term(m, {"tags": {"team": ""}}),
            "empty tag keys or values aren't supported",
        ),
        (
            "NodePool",
            "gpu-large",
            lambda m: m["spec"]["limits"].update(cpu="384"),
            "only 'limits.nodes' is supported on static NodePools",
        ),
        (
            "NodePool",
            "gpu-large",
            lambda m: m["spec"].update(weight=10),
            "'weight' is not supported on static NodePools",
        ),
        (
            # Kubernetes' `find` at work: a label in Karpenter's own domain is refused.
            "NodePool",
            "gpu-large",
            lambda m: m["spec"]["template"]["metadata"]["labels"].update(
                {"karpenter.sh/reserved": "true"}
            ),
            'label domain "karpenter.sh" is restricted',
        ),
        (
            "ResourceFlavor",
            "gpu-large",
            lambda m: m["spec"].pop("nodeLabels"),
            "at least one nodeLabel is required when topology is set",
        ),
        (
            "Topology",
            NETWORK_TOPOLOGY,
            lambda m: m["spec"]["levels"].reverse(),
            "kubernetes.io/hostname label can only be used at the lowest level",
        ),
        (
            "Topology",
            NETWORK_TOPOLOGY,
            lambda m: m["spec"]["levels"].append(m["spec"]["levels"][0]),
            "must be unique",
        ),
    ],
)
def test_cel_rules_refuse_bad_shapes(reserved_plan, kind, name, mutate, expected):
    manifest = spec(reserved_plan, kind, name)
    assert cel_violations(manifest) == []
    mutate(manifest)
    assert any(expected in v for v in cel_violations(manifest)), cel_violations(manifest)


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("NodePool", "Cannot transition NodePool between static (replicas set) and dynamic"),
        ("ResourceFlavor", "topologyName is immutable when topologyName is set"),
    ],
)
def test_turning_static_off_in_place_is_refused_by_the_api_server(reserved_plan, kind, expected):
    """Why the README says to remove and re-add a pool to change staticNodes: the update from the
    static, topology-placed pool to a dynamic one breaks transition rules."""
    old = spec(reserved_plan, kind, "gpu-large")
    new = copy.deepcopy(old)
    new["spec"].pop("replicas" if kind == "NodePool" else "topologyName")
    assert cel_violations(old, old) == []
    assert any(expected in v for v in cel_violations(new, old))


@pytest.mark.parametrize(("fixture", "static"), [("reserved_plan", "true"), ("dev_plan", "false")])
def test_feature_gates_reach_the_controller_through_the_chart(request, fixture, static):
    """Our Helm values coalesced over the chart's, as Helm does (maps merge key by key: helm
    pkg/chartutil/coalesce.go), then rendered into FEATURE_GATES as the chart's template does."""
    plan = request.getfixturevalue(fixture)
    ours = plan.one("kubernetes:helm.sh/v3:Release", "karpenter").inputs["values"]
    chart = {
        "settings": {
            "featureGates": karpenter.CHART_FEATURE_GATES,
            "awsFeatureGates": karpenter.CHART_AWS_FEATURE_GATES,
        }
    }
    merged = deep_merge(chart, ours)
    env = karpenter.feature_gates_env(merged)
    gates = dict(g.split("=") for g in env.split(","))
    # Reservations and Capacity Blocks need ReservedCapacity: the chart's default keeps it on.
    assert gates["ReservedCapacity"] == "true"
    assert gates["StaticCapacity"] == static
    # Node repair is on in both stacks, which have GPU pools: it may reboot a GPU node first.
    aws_gates = karpenter.feature_gates_env(merged, "awsFeatureGates")
    assert aws_gates == "NodeClassCEL=false,RebootForRepair=true"


def test_controller_may_launch_into_reservations_as_upstream_allows(reserved_plan):
    """Every statement of Karpenter's reference controller policy about capacity reservations is
    in ours with the same actions and the same reservation resources."""
    ours = {s["Sid"]: s for s in statements(reserved_plan)}
    for sid, upstream in karpenter.RESERVATION_STATEMENTS.items():
        mine = ours[sid]
        assert sorted(listed(mine["Action"])) == sorted(upstream["actions"]), sid
        wanted = [r.format(region="us-west-2") for r in upstream["resources"]]
        assert set(wanted) <= set(listed(mine["Resource"])), sid


# --- Kueue: topology for the jobs of a static EFA pool -------------------------------------------


def test_static_efa_pool_flavor_names_the_network_topology(reserved_plan):
    topology = spec(reserved_plan, "Topology", NETWORK_TOPOLOGY)
    assert [level["nodeLabel"] for level in topology["spec"]["levels"]] == [
        "topology.k8s.aws/network-node-layer-1",
        "topology.k8s.aws/network-node-layer-2",
        "topology.k8s.aws/network-node-layer-3",
        "kubernetes.io/hostname",
    ]
    assert spec(reserved_plan, "ResourceFlavor", "gpu-large")["spec"]["topologyName"] == (
        NETWORK_TOPOLOGY
    )
    # Dynamic pools: Kueue could place nothing (no nodes exist until Karpenter sees pending pods).
    for pool in ("gpu-small", "cpu"):
        assert "topologyName" not in spec(reserved_plan, "ResourceFlavor", pool)["spec"]
    (flavor,) = [
        r
        for r in reserved_plan.of_type("kubernetes:kueue.x-k8s.io/v1beta2:ResourceFlavor")
        if r.inputs["metadata"]["name"] == "gpu-large"
    ]
    (topology_resource,) = reserved_plan.of_type("kubernetes:kueue.x-k8s.io/v1beta2:Topology")
    assert topology_resource.urn in flavor.dependencies  # created first, deleted last


def test_dynamic_pools_get_no_topology(dev_plan):
    assert dev_plan.of_type("kubernetes:kueue.x-k8s.io/v1beta2:Topology") == []


TOPOLOGY_ANNOTATIONS = (
    "kueue.x-k8s.io/podset-required-topology",
    "kueue.x-k8s.io/podset-preferred-topology",
    "kueue.x-k8s.io/podset-unconstrained-topology",
)
# A qualified label name (apimachinery validation.IsQualifiedName), what Kueue's webhook checks a
# topology annotation's value with (ValidateLabelName).
QUALIFIED_NAME = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)


def tas_webhook_errors(annotations: dict) -> list[str]:
    """Kueue's check (at KUEUE_CHART) of a pod set's topology annotations
    (pkg/controller/jobframework/tas_validation.go, ValidateTASPodSetRequest): at most one of the
    three, label names as values, unconstrained a bool."""
    found = [a for a in TOPOLOGY_ANNOTATIONS if a in annotations]
    errors = ["more than one topology annotation"] if len(found) > 1 else []
    for name in TOPOLOGY_ANNOTATIONS[:2]:
        if name in annotations and not QUALIFIED_NAME.match(annotations[name]):
            errors.append(f"{name}: not a label name")
    unconstrained = annotations.get(TOPOLOGY_ANNOTATIONS[2])
    if unconstrained is not None and unconstrained not in (
        "true",
        "false",
        "True",
        "False",
        "1",
        "0",
    ):
        errors.append("unconstrained: not a bool")
    return errors


def pod_sets(job: dict) -> dict[str, dict]:
    replicas = job["spec"].get("pytorchReplicaSpecs") or job["spec"]["mpiReplicaSpecs"]
    return {role: spec["template"]["metadata"]["annotations"] for role, spec in replicas.items()}


def test_every_pod_set_on_a_topology_flavor_asks_for_topology_kueue_can_satisfy(reserved_plan):
    """Kueue admits onto a topology flavor of a mixed ClusterQueue only pod sets that request
    topology, at a level the flavor's Topology has (pkg/scheduler/flavorassigner/
    tas_flavorassigner.go, checkPodSetAndFlavorMatchForTAS); pod sets elsewhere must not."""
    levels = {
        level["nodeLabel"]
        for level in spec(reserved_plan, "Topology", NETWORK_TOPOLOGY)["spec"]["levels"]
    }
    jobs = [
        r.inputs
        for r in custom_resources(reserved_plan)
        if r.inputs["kind"] in ("PyTorchJob", "MPIJob")
    ]
    asked = {}
    for job in jobs:
        pool_of = {
            role: spec["template"]["spec"]["nodeSelector"][
                "training-platform.node-restriction.kubernetes.io/pool"
            ]
            for role, spec in (
                job["spec"].get("pytorchReplicaSpecs") or job["spec"]["mpiReplicaSpecs"]
            ).items()
        }
        for role, annotations in pod_sets(job).items():
            assert tas_webhook_errors(annotations) == []
            requested = [a for a in TOPOLOGY_ANNOTATIONS if a in annotations]
            if pool_of[role] == "gpu-large":
                (annotation,) = requested
                if annotation != TOPOLOGY_ANNOTATIONS[2]:
                    assert annotations[annotation] in levels
                asked[(job["metadata"]["name"], role)] = (annotation, annotations[annotation])
            else:
                assert requested == []
    preferred = ("kueue.x-k8s.io/podset-preferred-topology", TOPOLOGY_LEVELS[2])
    assert asked == {
        ("gpt-large", "Worker"): preferred,
        ("gpt-large-mpi", "Worker"): preferred,
        ("gpt-large-mpi", "Launcher"): ("kueue.x-k8s.io/podset-unconstrained-topology", "true"),
    }


def test_the_webhook_rule_restated_here_catches_what_kueue_refuses():
    assert tas_webhook_errors({TOPOLOGY_ANNOTATIONS[0]: "a", TOPOLOGY_ANNOTATIONS[1]: "a"})
    assert tas_webhook_errors({TOPOLOGY_ANNOTATIONS[1]: "bad label/"})
    assert tas_webhook_errors({TOPOLOGY_ANNOTATIONS[2]: "yes"})


# --- cost: a reservation bills used or not ----------------------------------------------------


def test_reservations_are_a_fixed_cost_and_the_pool_prices_only_what_they_do_not_hold(
    reserved_plan,
):
    prices = load_prices("us-west-2")
    p4d = prices.instance("p4d.24xlarge")
    disk = 200 * prices.usd("ebsGp3PerGibMonth") / 730  # the pool's root volume, GiB-hour
    cost = stack_cost(prices, declared_in(reserved_plan))
    lines = {line.item: line for line in cost.lines}
    odcr = lines["reserved gpu-large"]
    assert odcr.usd_per_hour == pytest.approx(2 * p4d) and odcr.detail.startswith("2 x p4d")
    pool = lines["gpu-large"]
    assert pool.usd_per_hour == pytest.approx((4 - 3) * p4d + 4 * disk)
    # Static: its nodes run whether or not a job does, so every line is floor.
    assert {odcr.part, pool.part, lines["capacity block gpu-large 1"].part} == {Part.FLOOR}
    assert pool.detail.startswith("static, always on: 4 x p4d.24xlarge")

    # The same pool without staticNodes: its line is a ceiling again, the reservations still fixed.
    def dynamic(r: Declared) -> Declared:
        if r.type != NODEPOOL:
            return r
        props = copy.deepcopy(dict(r.props))
        props["spec"].pop("replicas", None)
        return Declared(r.urn, r.type, r.name, props, r.dependencies)

    dynamic_cost = stack_cost(prices, [dynamic(r) for r in declared_in(reserved_plan)])
    lines = {line.item: line for line in dynamic_cost.lines}
    assert lines["gpu-large"].part == Part.POOL and lines["reserved gpu-large"].part == Part.FLOOR
    assert dynamic_cost.total_per_hour == pytest.approx(cost.total_per_hour)


def block_line(**block) -> CostLine:
    """The Capacity Block line of dev's EFA pool holding the block RESERVATIONS[1] amended."""
    reservation = {**RESERVATIONS[1], "instanceCount": 2, **block}
    plan = plan_of("dev", **dev_with({**RESERVED_POOL, "capacityReservations": [reservation]}))
    cost = stack_cost(load_prices("us-west-2"), declared_in(plan))
    (line,) = [line for line in cost.lines if line.item.startswith("capacity block")]
    return line


def test_a_capacity_block_is_paid_up_front_for_its_length_at_its_own_rate():
    """Its fee, not On-Demand x 730 h: the month holds only the block's hours, at the fee's
    rate (DescribeCapacityBlockOfferings' UpfrontFee for its CapacityBlockDurationHours)."""
    line = block_line(durationHours=168, upfrontFeeUsd=5000.0)
    assert line.part == Part.FLOOR
    assert line.usd_per_hour == pytest.approx(5000.0 / 168)  # both instances
    assert line.usd_per_month == pytest.approx(5000.0)  # a week: its fee is all it bills
    assert "2 x p4d.24xlarge Capacity Block, 168 h paid up front $5,000" in line.detail
    # Without its fee: the region's published block rate, named as such.
    published = yaml.safe_load((PRICES_DIR / "us-west-2.yaml").read_text())
    rate = published["capacityBlockPrices"]["p4d.24xlarge"]["usd"]
    line = block_line(durationHours=24 * 28)
    assert line.usd_per_hour == pytest.approx(2 * rate)
    assert line.usd_per_month == pytest.approx(2 * rate * 24 * 28)
    assert f"published rate ${rate}/instance-hour" in line.detail
    assert line.usd_per_hour < 2 * load_prices("us-west-2").instance("p4d.24xlarge")


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"durationHours": None}, "a capacity-block reservation needs durationHours"),
        ({"durationHours": 12}, "greater than or equal to 24"),
        (
            {"reservationType": "default", "id": ODCR, "tags": None},
            "durationHours and upfrontFeeUsd are set on an On-Demand Capacity Reservation",
        ),
    ],
)
def test_a_block_needs_its_length_and_an_odcr_has_none(entry, message):
    reservation = {k: v for k, v in {**RESERVATIONS[1], **entry}.items() if v is not None}
    pool = {**RESERVED_POOL, "capacityReservations": [reservation]}
    with pytest.raises(ConfigError) as caught:
        parse_stack_config(stack_values("dev", **dev_with(pool)), "Pulumi.dev.yaml")
    assert message in str(caught.value)


# --- preflight against DescribeCapacityReservations -------------------------------------------


def reservation(**fields) -> dict:
    """One CapacityReservation as DescribeCapacityReservations returns it."""
    return {
        "CapacityReservationId": ODCR,
        "OwnerId": "123456789012",
        "CapacityReservationArn": f"arn:aws:ec2:us-west-2:123456789012:capacity-reservation/{ODCR}",
        "AvailabilityZoneId": "usw2-az1",
        "InstanceType": "p4d.24xlarge",
        "InstancePlatform": "Linux/UNIX",
        "AvailabilityZone": "us-west-2a",
        "Tenancy": "default",
        "TotalInstanceCount": 2,
        "AvailableInstanceCount": 2,
        "EbsOptimized": True,
        "EphemeralStorage": False,
        "State": "active",
        "StartDate": datetime(2026, 11, 1, tzinfo=UTC),
        "EndDateType": "unlimited",
        "InstanceMatchCriteria": "targeted",
        "CreateDate": datetime(2026, 11, 1, tzinfo=UTC),
        "Tags": [],
        "ReservationType": "default",
        **fields,
    }


BLOCK = reservation(
    CapacityReservationId="cr-0b1b2c3d4e5f60718",
    TotalInstanceCount=1,
    AvailableInstanceCount=1,
    State="scheduled",
    StartDate=datetime(2026, 12, 1, 11, 30, tzinfo=UTC),
    EndDate=datetime(2026, 12, 8, 11, 30, tzinfo=UTC),
    EndDateType="limited",
    ReservationType="capacity-block",
    Tags=[{"Key": "team", "Value": "research"}, {"Key": "purpose", "Value": "nccl"}],
)
# What Karpenter's selector terms select, as the same query (capacityreservation/types.go).
BY_ID = {"CapacityReservationIds": [ODCR]}
BY_TAGS = {
    "Filters": [
        {"Name": "tag-key", "Values": ["purpose"]},
        {"Name": "tag:team", "Values": ["research"]},
    ]
}


def check(answers: list[tuple[dict, dict | str]]) -> preflight.Report:
    """check_reservations on the reserved stack, EC2 answering each expected query in turn."""
    config = parse_stack_config(stack_values("dev", **dev_with(RESERVED_POOL)), "Pulumi.dev.yaml")
    ec2 = boto3.client(
        "ec2", region_name="us-west-2", aws_access_key_id="x", aws_secret_access_key="x"
    )
    stubber = Stubber(ec2)
    for params, answer in answers:
        if isinstance(answer, str):
            stubber.add_client_error(
                "describe_capacity_reservations", answer, expected_params=params
            )
        else:
            stubber.add_response("describe_capacity_reservations", answer, params)
    report = preflight.Report()
    with stubber:
        preflight.check_reservations(config, ec2, ["us-west-2a", "us-west-2b"], report)
    stubber.assert_no_pending_responses()
    return report


def test_active_reservations_in_the_pools_zone_pass():
    block = {**BLOCK, "State": "active"}
    report = check(
        [
            (BY_ID, {"CapacityReservations": [reservation()]}),
            (BY_TAGS, {"CapacityReservations": [block]}),
        ]
    )
    assert report.problems == [] and report.warnings == []
    assert report.notes == [
        f"gpu-large: {ODCR} active, 2 of 2 x p4d.24xlarge free in us-west-2a",
        "gpu-large: cr-0b1b2c3d4e5f60718 active, 1 of 1 x p4d.24xlarge free in us-west-2a, "
        "2026-12-01 to 2026-12-08",
    ]


def test_a_scheduled_capacity_block_warns_with_its_dates():
    report = check(
        [
            (BY_ID, {"CapacityReservations": [reservation()]}),
            (BY_TAGS, {"CapacityReservations": [BLOCK]}),
        ]
    )
    assert report.problems == []
    assert report.warnings == [
        "gpu-large: cr-0b1b2c3d4e5f60718 scheduled, 2026-12-01 to 2026-12-08: Karpenter launches "
        "into it once active"
    ]


def test_missing_expired_misplaced_or_miscounted_reservations_are_errors():
    elsewhere = reservation(
        State="expired", AvailabilityZone="us-west-2b", InstanceType="p4de.24xlarge"
    )
    report = check(
        [
            (BY_ID, {"CapacityReservations": [elsewhere]}),
            (BY_TAGS, "InvalidCapacityReservationId.NotFound"),
        ]
    )
    assert report.problems == [
        f"gpu-large: {ODCR}: instance type p4de.24xlarge (wanted p4d.24xlarge); zone us-west-2b "
        "(the pool's: us-west-2a); state expired (Karpenter launches only into active "
        "reservations)",
        "gpu-large: capacity reservation tags purpose=*, team=research not found",
    ]
    odcr_as_block = reservation(ReservationType="capacity-block", TotalInstanceCount=3)
    report = check(
        [
            (BY_ID, {"CapacityReservations": [odcr_as_block]}),
            (BY_TAGS, {"CapacityReservations": []}),
        ]
    )
    assert report.problems == [
        f"gpu-large: {ODCR}: reservationType capacity-block (wanted default)",
        f"gpu-large: {ODCR} holds 3 instances, the stack file says instanceCount 2 (what the plan "
        "prices)",
        "gpu-large: capacity reservation tags purpose=*, team=research not found",
    ]


def test_reserved_pools_count_against_the_on_demand_quota():
    assert preflight.quota_bucket("p4d.24xlarge", "reserved").code == "L-417A185B"
