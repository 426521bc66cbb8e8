"""Network component: subnets across AZs, tags Karpenter and the ELB controller need, NAT layout,
VPC endpoints and what they cost."""

import ipaddress

import pytest

from infra.core.catalog import load_prices
from infra.core.config import ConfigError
from infra.core.declared import declared_in
from infra.integrations import plan_cost
from infra.jobs.usage import usage_lines
from infra.stack.loading import parse_stack_config
from tests.plugin import plan_of, stack_values

SUBNET = "aws:ec2/subnet:Subnet"
INTERNAL_ELB = "kubernetes.io/role/internal-elb"


def subnets(plan, kind):
    return [r for r in plan.of_type(SUBNET) if f"-{kind}-" in r.name]


def test_private_subnets_carry_discovery_and_internal_elb_tags(stack_plan):
    cluster = stack_plan.one("eks:index:Cluster").inputs["name"]
    private = subnets(stack_plan, "private")
    assert private
    for subnet in private:
        assert subnet.inputs["tags"]["karpenter.sh/discovery"] == cluster
        assert subnet.inputs["tags"]["kubernetes.io/role/internal-elb"] == "1"


def test_public_subnets_are_for_load_balancers_only(stack_plan):
    for subnet in subnets(stack_plan, "public"):
        assert subnet.inputs["tags"]["kubernetes.io/role/elb"] == "1"
        assert "karpenter.sh/discovery" not in subnet.inputs["tags"]
        assert subnet.inputs["mapPublicIpOnLaunch"] is False


@pytest.mark.parametrize(("stack", "azs"), [("dev", 2), ("prod", 3)])
def test_one_private_and_public_subnet_per_az_without_overlap(stack, azs, request):
    plan = request.getfixturevalue(f"{stack}_plan")
    vpc = ipaddress.ip_network(plan.one("aws:ec2/vpc:Vpc").inputs["cidrBlock"])
    for kind in ("private", "public"):
        assert len({s.inputs["availabilityZone"] for s in subnets(plan, kind)}) == azs
    cidrs = [ipaddress.ip_network(s.inputs["cidrBlock"]) for s in plan.of_type(SUBNET)]
    assert all(c.subnet_of(vpc) for c in cidrs)
    assert not any(a.overlaps(b) for i, a in enumerate(cidrs) for b in cidrs[i + 1 :])


@pytest.mark.parametrize(("stack", "azs"), [("dev", 2), ("prod", 3)])
def test_the_control_plane_has_subnets_of_its_own_no_node_pod_or_balancer_selects(
    stack, azs, request
):
    """Their range is the API server's source address and no pod's: the platform namespaces'
    NetworkPolicies admit webhook calls by it (infra/core/network_policies.py)."""
    plan = request.getfixturevalue(f"{stack}_plan")
    control_plane = subnets(plan, "control-plane")
    assert len({s.inputs["availabilityZone"] for s in control_plane}) == azs
    for subnet in control_plane:
        assert ipaddress.ip_network(subnet.inputs["cidrBlock"]).prefixlen == 28
        tags = set(subnet.inputs["tags"])
        assert not tags & {"karpenter.sh/discovery", "kubernetes.io/role/elb", INTERNAL_ELB}
    ids = [s.outputs["id"] for s in control_plane]
    assert plan.one("eks:index:Cluster").inputs["subnetIds"] == ids
    # Routed like the private subnets: the API server reaches pods and hybrid nodes from them.
    private_tables = {
        a.inputs["routeTableId"]
        for a in plan.of_type("aws:ec2/routeTableAssociation:RouteTableAssociation")
        if "-private-" in a.name
    }
    routed = [
        a.inputs["routeTableId"]
        for a in plan.of_type("aws:ec2/routeTableAssociation:RouteTableAssociation")
        if "-control-plane-" in a.name
    ]
    assert len(routed) == azs and set(routed) <= private_tables
    sources = {
        block["ipBlock"]["cidr"]
        for policy in plan.of_type("kubernetes:networking.k8s.io/v1:NetworkPolicy")
        if policy.inputs["metadata"]["name"] == "from-the-api-server"
        for rule in policy.inputs["spec"]["ingress"]
        for block in rule["from"]
    }
    assert sources == {s.inputs["cidrBlock"] for s in control_plane}


def test_control_plane_subnets_may_be_named_and_are_checked():
    network = {"controlPlaneSubnetCidrs": ["10.20.240.0/27", "10.20.240.32/27"]}
    plan = plan_of("dev", network=network)
    assert [s.inputs["cidrBlock"] for s in subnets(plan, "control-plane")] == network[
        "controlPlaneSubnetCidrs"
    ]
    for cidrs, message in (
        (["10.20.240.0/29", "10.20.240.8/29"], "is smaller than /28"),
        (["10.20.224.0/28", "10.20.240.0/28"], "overlap"),  # in the first public subnet
        (["10.20.240.0/28"], r"has 1 entries; allowed: one per AZ \(2\)"),
    ):
        with pytest.raises(ConfigError, match=message):
            parse_stack_config(
                stack_values("dev", network={"controlPlaneSubnetCidrs": cidrs}), "Pulumi.dev.yaml"
            )


def nat_of_route_table(plan, route_table):
    (route,) = route_table.inputs["routes"]
    assert route["cidrBlock"] == "0.0.0.0/0"
    return route["natGatewayId"]


def test_dev_routes_every_az_through_one_nat(dev_plan):
    assert len(dev_plan.of_type("aws:ec2/natGateway:NatGateway")) == 1
    private_rts = [
        r for r in dev_plan.of_type("aws:ec2/routeTable:RouteTable") if "-private-" in r.name
    ]
    assert len({nat_of_route_table(dev_plan, rt) for rt in private_rts}) == 1


def test_prod_has_a_nat_per_az_in_public_subnets(prod_plan):
    nats = prod_plan.of_type("aws:ec2/natGateway:NatGateway")
    private_rts = [
        r for r in prod_plan.of_type("aws:ec2/routeTable:RouteTable") if "-private-" in r.name
    ]
    assert len(nats) == 3
    assert len({nat_of_route_table(prod_plan, rt) for rt in private_rts}) == 3
    public_ids = {s.urn for s in subnets(prod_plan, "public")}
    for nat in nats:
        assert public_ids & set(nat.dependencies)


def test_public_route_goes_to_internet_gateway(dev_plan):
    (route,) = dev_plan.one("aws:ec2/routeTable:RouteTable", "network-public").inputs["routes"]
    assert route["cidrBlock"] == "0.0.0.0/0" and route["gatewayId"].startswith("igw-")


def test_existing_vpc_is_adopted_and_its_subnets_tagged():
    existing = {
        "vpcId": "vpc-0123456789abcdef0",
        "privateSubnetIds": ["subnet-0aaaaaaaaaaaaaaaa", "subnet-0bbbbbbbbbbbbbbbb"],
        "publicSubnetIds": ["subnet-0cccccccccccccccc"],
    }
    pools = stack_values("dev")["training-platform:nodePools"]
    # An adopted VPC's AZs are unknown to the program: EFA pools name theirs.
    pools = [{**p, "availabilityZone": "us-west-2b"} if p.get("efa") else p for p in pools]
    plan = plan_of("dev", network={"existingVpc": existing, "vpcEndpoints": []}, nodePools=pools)
    assert not plan.of_type("aws:ec2/vpc:Vpc") and not plan.of_type(SUBNET)
    tags = {
        (t.inputs["resourceId"], t.inputs["key"]): t.inputs["value"]
        for t in plan.of_type("aws:ec2/tag:Tag")
    }
    for subnet_id in existing["privateSubnetIds"]:
        assert tags[(subnet_id, "karpenter.sh/discovery")] == "tp-dev"
    cluster = plan.one("eks:index:Cluster").inputs
    assert cluster["vpcId"] == existing["vpcId"]
    assert cluster["privateSubnetIds"] == existing["privateSubnetIds"]
    # The control plane stays in the adopted subnets: the webhook policies admit the VPC.
    assert "subnetIds" not in cluster
    webhooks = [
        p.inputs["spec"]
        for p in plan.of_type("kubernetes:networking.k8s.io/v1:NetworkPolicy")
        if p.inputs["metadata"]["name"] == "from-the-api-server"
    ]
    assert webhooks and all(
        rule["from"] == [{"ipBlock": {"cidr": "10.20.0.0/16"}}]
        for spec in webhooks
        for rule in spec["ingress"]
    )


ENDPOINT = "aws:ec2/vpcEndpoint:VpcEndpoint"


def test_prod_reaches_the_controllers_aws_apis_through_interface_endpoints(prod_plan):
    """One network interface per private subnet, the services' own names (private DNS), and a
    security group that takes HTTPS from the VPC and nothing else."""
    vpc_cidr = prod_plan.one("aws:ec2/vpc:Vpc").inputs["cidrBlock"]
    private_ids = {s.urn for s in subnets(prod_plan, "private")}
    endpoints = {e.inputs["serviceName"]: e for e in prod_plan.of_type(ENDPOINT)}
    services = {"ec2", "ecr.api", "ecr.dkr", "eks", "eks-auth", "elasticfilesystem", "sqs", "ssm"}
    assert set(endpoints) == {f"com.amazonaws.us-west-2.{s}" for s in services | {"s3"}}
    (group,) = [
        g
        for g in prod_plan.of_type("aws:ec2/securityGroup:SecurityGroup")
        if g.name == "network-endpoints"
    ]
    rules = [
        r
        for r in prod_plan.of_type("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")
        if group.urn in r.dependencies
    ]
    assert [(r.inputs["cidrIpv4"], r.inputs["fromPort"], r.inputs["toPort"]) for r in rules] == [
        (vpc_cidr, 443, 443)
    ]
    for service in services:
        endpoint = endpoints[f"com.amazonaws.us-west-2.{service}"]
        assert endpoint.inputs["vpcEndpointType"] == "Interface"
        assert endpoint.inputs["privateDnsEnabled"] is True
        assert len(endpoint.inputs["subnetIds"]) == 3
        assert private_ids <= set(endpoint.dependencies) and group.urn in endpoint.dependencies


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_s3_is_a_gateway_on_every_private_route_table(stack, request):
    plan = request.getfixturevalue(f"{stack}_plan")
    (s3,) = [e for e in plan.of_type(ENDPOINT) if e.inputs["serviceName"].endswith(".s3")]
    private_rts = {
        r.urn for r in plan.of_type("aws:ec2/routeTable:RouteTable") if "-private-" in r.name
    }
    assert s3.inputs["vpcEndpointType"] == "Gateway"
    assert len(s3.inputs["routeTableIds"]) == len(private_rts)
    assert private_rts <= set(s3.dependencies)


def test_interface_endpoints_are_priced_per_az_and_gateways_free(dev_plan, prod_plan):
    """PrivateLink bills an interface endpoint per hour in each AZ; a gateway has no hourly
    charge (aws.amazon.com/privatelink/pricing)."""
    per_az_hour = load_prices("us-west-2").usd("vpcInterfaceEndpointPerAzHour")
    lines = {}
    for stack, plan in (("dev", dev_plan), ("prod", prod_plan)):
        cost = plan_cost("us-west-2", plan)
        lines[stack] = {
            line.item: (line.detail, line.usd_per_hour)
            for line in cost.baseline
            if line.item.startswith("VPC endpoint ")
        }
        usage = [u.item for u in usage_lines(cost, declared_in(plan))]
        assert ("VPC endpoint data" in usage) == (stack == "prod")
    assert lines["dev"] == {"VPC endpoint network-s3": ("s3 gateway, free", 0)}
    assert lines["prod"].pop("VPC endpoint network-s3") == ("s3 gateway, free", 0)
    assert len(lines["prod"]) == 8
    for item, (detail, usd_per_hour) in lines["prod"].items():
        assert detail.endswith(" interface in 3 AZs, + $0.01/GB"), item
        assert usd_per_hour == pytest.approx(3 * per_az_hour)


@pytest.mark.parametrize(
    ("network", "message"),
    [
        (
            {"vpcEndpoints": ["s3", "dynamodb"]},
            "network.vpcEndpoints[1]: Input should be 's3', 'ec2'",
        ),
        ({"vpcEndpoints": ["ec2", "ec2"]}, "network: vpcEndpoints lists ec2 more than once"),
        (
            {
                "vpcEndpoints": ["s3"],
                "existingVpc": {
                    "vpcId": "vpc-0123abcd",
                    "privateSubnetIds": ["subnet-0123abcd", "subnet-0123abce"],
                },
            },
            "network: vpcEndpoints is set with existingVpc; allowed: no vpcEndpoints",
        ),
    ],
)
def test_vpc_endpoint_config_errors_name_the_key(network, message):
    with pytest.raises(ConfigError) as error:
        parse_stack_config(stack_values("dev", network=network), "Pulumi.dev.yaml")
    assert f"training-platform:{message}" in str(error.value)
