"""Network component: subnets across AZs, tags Karpenter and the ELB controller need, NAT layout."""

import ipaddress

import pytest

from tests.conftest import plan_of, stack_values

SUBNET = "aws:ec2/subnet:Subnet"


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
    plan = plan_of("dev", network={"existingVpc": existing}, nodePools=pools)
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
