"""What the platform knows about the VPC's resource kinds: NAT gateways, endpoints and public
addresses bill by the hour; the VPC's own constructs are free; which inputs replace them."""

from collections.abc import Callable, Sequence

from infra.core.bill import CostLine, PriceBook
from infra.core.catalog import UnpricedError
from infra.core.declared import Declared, dig, listed
from infra.core.facts import K8S, TF, Kind, ReplaceRule
from infra.vpc.network import PUBLIC_ELB_TAG

SUBNET = "aws:ec2/subnet:Subnet"
NAT_GATEWAY = "aws:ec2/natGateway:NatGateway"
VPC_ENDPOINT = "aws:ec2/vpcEndpoint:VpcEndpoint"
_VPC = "VPC pricing: no charge for the VPC and its routing and security constructs"


def _nat_gateway(r: Declared, stack: Sequence[Declared], book: PriceBook) -> list[CostLine]:
    return [
        CostLine(
            f"NAT gateway {r.name}",
            f"+ ${book.usd('natGatewayPerGb')}/GB processed (usage)",
            book.usd("natGatewayPerHour"),
        )
    ]


def _vpc_endpoint(r: Declared, stack: Sequence[Declared], book: PriceBook) -> list[CostLine]:
    """An interface endpoint bills per hour in each AZ it has a network interface in (one per
    subnet); a gateway endpoint (S3), EC2's default type, has no charge."""
    kind = dig(r.props, "vpcEndpointType") or "Gateway"
    service = str(dig(r.props, "serviceName")).rsplit(".", 1)[-1]
    if kind == "Gateway":
        return [CostLine(f"VPC endpoint {r.name}", f"{service} gateway, free", 0.0)]
    if kind != "Interface":
        raise UnpricedError(f"a {kind} VPC endpoint has no price in {book.prices.file}")
    azs = len(listed(dig(r.props, "subnetIds")))
    return [
        CostLine(
            f"VPC endpoint {r.name}",
            f"{service} interface in {azs} AZs, + ${book.usd('vpcInterfaceEndpointPerGb')}/GB",
            azs * book.usd("vpcInterfaceEndpointPerAzHour"),
        )
    ]


def _elastic_ip(r: Declared, stack: Sequence[Declared], book: PriceBook) -> list[CostLine]:
    """A public IPv4 address bills per hour, attached or idle (since 2024-02-01). EC2 releases
    the hybrid gateway's launch-time public address when its Elastic IP attaches (EC2 User Guide,
    "Public IPv4 addresses"), so this line is the gateway's only address."""
    return [CostLine(f"Elastic IP {r.name}", "public IPv4 address", book.usd("publicIpv4PerHour"))]


def public_azs(stack: Sequence[Declared]) -> int:
    """How many AZs a public load balancer spans: the subnets tagged for one."""
    key, value = next(iter(PUBLIC_ELB_TAG.items()))
    return sum(1 for d in stack if d.type == SUBNET and dig(d.props, "tags", key) == value)


def classic_load_balancer(stack: Sequence[Declared], book: PriceBook) -> tuple[int, float]:
    """The AZs a Classic Load Balancer spans and its hourly rate with a public IPv4 address in
    each."""
    azs = public_azs(stack)
    return azs, classic_load_balancer_per_hour(azs, book.usd)


def classic_load_balancer_per_hour(azs: int, usd: Callable[[str], float]) -> float:
    """A Classic Load Balancer's hourly rate with a public IPv4 address in each of `azs` AZs
    (`usd`: a price file's figure by key)."""
    return usd("classicLoadBalancerPerHour") + azs * usd("publicIpv4PerHour")


def _service(r: Declared, stack: Sequence[Declared], book: PriceBook) -> list[CostLine]:
    """A Service of type LoadBalancer is a Classic Load Balancer (the in-tree controller's
    default without annotations) with a public IPv4 address in each public subnet's AZ."""
    if dig(r.props, "spec", "type") != "LoadBalancer":
        return []
    azs, per_hour = classic_load_balancer(stack, book)
    return [
        CostLine(
            f"load balancer {dig(r.props, 'metadata', 'name') or r.name}",
            f"Classic LB in {azs} AZs, + ${book.usd('classicLoadBalancerPerGb')}/GB",
            per_hour,
        )
    ]


KINDS = (
    Kind(NAT_GATEWAY, price=_nat_gateway),
    Kind(VPC_ENDPOINT, price=_vpc_endpoint),
    Kind("aws:ec2/eip:Eip", price=_elastic_ip),
    Kind(
        "kubernetes:core/v1:Service",
        price=_service,
        replace=ReplaceRule(("spec.clusterIP",), K8S),
    ),
    Kind(
        "aws:ec2/vpc:Vpc",
        free=_VPC,
        replace=ReplaceRule(
            ("cidrBlock", "ipv4IpamPoolId", "ipv4NetmaskLength"), f"{TF}/ec2/vpc_.go"
        ),
    ),
    Kind(
        SUBNET,
        free=_VPC,
        replace=ReplaceRule(
            (
                "availabilityZone",
                "availabilityZoneId",
                "cidrBlock",
                "ipv6Native",
                "outpostArn",
                "vpcId",
            ),
            f"{TF}/ec2/vpc_subnet.go",
        ),
    ),
    Kind("aws:ec2/routeTable:RouteTable", free=_VPC),
    Kind("aws:ec2/routeTableAssociation:RouteTableAssociation", free=_VPC),
    Kind("aws:ec2/route:Route", free=_VPC),
    Kind("aws:ec2/internetGateway:InternetGateway", free=_VPC),
    Kind(
        "aws:ec2/securityGroup:SecurityGroup",
        free=_VPC,
        replace=ReplaceRule(
            ("description", "name", "namePrefix", "vpcId"), f"{TF}/ec2/vpc_security_group.go"
        ),
    ),
    Kind("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule", free=_VPC),
    Kind("aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule", free=_VPC),
)
