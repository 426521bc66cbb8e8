"""Network: the VPC the cluster lives in, created here or adopted from config."""

import ipaddress

import pulumi
import pulumi_aws as aws

from infra.core.config import ConfigError
from infra.vpc.config import GATEWAY_ENDPOINTS, NetworkConfig

HTTPS = 443

# Subnet tags that the AWS Load Balancer Controller and Karpenter select by.
PUBLIC_ELB_TAG = {"kubernetes.io/role/elb": "1"}
INTERNAL_ELB_TAG = {"kubernetes.io/role/internal-elb": "1"}


def discovery_tag(cluster_name: str) -> dict[str, str]:
    """The tag Karpenter's EC2NodeClass selects subnets and security groups by."""
    return {"karpenter.sh/discovery": cluster_name}


class Network(pulumi.ComponentResource):
    vpc_id: pulumi.Output[str]
    private_subnet_ids: pulumi.Output[list[str]]
    private_subnets: list[pulumi.Input[str]]  # one id per AZ, for per-subnet resources
    public_subnet_ids: pulumi.Output[list[str]]
    # Created VPCs only (an adopted VPC's routing stays its owner's): hybrid nodes add routes.
    public_subnets: list[pulumi.Input[str]]
    route_table_ids: list[pulumi.Output[str]]  # public first, then one per private subnet
    cidr: ipaddress.IPv4Network
    # Where the EKS control plane's network interfaces go (created VPCs): subnets of their own,
    # so their range is the API server's source address and no pod's. None in an adopted VPC:
    # the cluster takes its private and public subnets, the VPC's range is the only bound.
    control_plane_subnet_ids: pulumi.Output[list[str]] | None
    control_plane_cidrs: list[ipaddress.IPv4Network] | None
    # How nodes and controllers reach AWS APIs and registries: the NAT path (gateways, their
    # addresses, the internet gateway, route tables and associations) and the VPC endpoints.
    # Whatever calls out depends on these, so destroy removes them only after it.
    egress: list[pulumi.Resource]

    def __init__(
        self,
        name: str,
        config: NetworkConfig,
        cluster_name: str,
        tags: dict[str, str],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("training-platform:infra:Network", name, None, opts)
        self._child = pulumi.ResourceOptions(parent=self)
        self._tags = tags
        self.cidr = config.cidr
        self._cluster_name = cluster_name
        if config.existing_vpc:
            self._adopt(name, config)
        else:
            self._create(name, config)
        self.register_outputs(
            {
                "vpcId": self.vpc_id,
                "privateSubnetIds": self.private_subnet_ids,
                "publicSubnetIds": self.public_subnet_ids,
            }
        )

    def _adopt(self, name: str, config: NetworkConfig) -> None:
        existing = config.existing_vpc
        # Karpenter finds node subnets by tag; an adopted VPC gets the tag on its private subnets.
        for i, subnet_id in enumerate(existing.private_subnet_ids):
            for key, value in {**discovery_tag(self._cluster_name), **INTERNAL_ELB_TAG}.items():
                aws.ec2.Tag(
                    f"{name}-private-{i}-{key.split('/')[-1]}",
                    resource_id=subnet_id,
                    key=key,
                    value=value,
                    opts=self._child,
                )
        self.vpc_id = pulumi.Output.from_input(existing.vpc_id)
        self.private_subnets = list(existing.private_subnet_ids)
        self.public_subnets, self.route_table_ids, self.egress = [], [], []
        self.private_subnet_ids = pulumi.Output.from_input(self.private_subnets)
        self.public_subnet_ids = pulumi.Output.from_input(list(existing.public_subnet_ids))
        self.control_plane_subnet_ids = self.control_plane_cidrs = None
        self.zones = None  # the adopted subnets' AZs are the owner's business

    def _create(self, name: str, config: NetworkConfig) -> None:
        zones = aws.get_availability_zones(state="available").names[: config.az_count]
        if len(zones) < config.az_count:
            raise ConfigError(
                f"Invalid stack config:\n  training-platform:network.azCount: {config.az_count}, "
                f"but the region has {len(zones)} available AZs; allowed: at most {len(zones)}"
            )
        private_cidrs, public_cidrs = config.subnet_cidrs()
        self.control_plane_cidrs = config.control_plane_cidrs()
        self.zones = list(zones)

        vpc = aws.ec2.Vpc(
            name,
            cidr_block=str(config.cidr),
            enable_dns_hostnames=True,
            enable_dns_support=True,
            tags=self._named(name),
            opts=self._child,
        )
        igw = aws.ec2.InternetGateway(name, vpc_id=vpc.id, tags=self._named(name), opts=self._child)
        public_rt = aws.ec2.RouteTable(
            f"{name}-public",
            vpc_id=vpc.id,
            routes=[aws.ec2.RouteTableRouteArgs(cidr_block="0.0.0.0/0", gateway_id=igw.id)],
            tags=self._named(f"{name}-public"),
            opts=self._child,
        )

        public_subnets, private_subnets, control_plane_subnets, nats = [], [], [], []
        self.route_table_ids = [public_rt.id]
        self.egress = [igw, public_rt]
        private_rts = []
        for i, (zone, private_cidr, public_cidr, control_plane_cidr) in enumerate(
            zip(zones, private_cidrs, public_cidrs, self.control_plane_cidrs, strict=True)
        ):
            public = aws.ec2.Subnet(
                f"{name}-public-{i}",
                vpc_id=vpc.id,
                cidr_block=str(public_cidr),
                availability_zone=zone,
                map_public_ip_on_launch=False,
                tags=self._named(f"{name}-public-{zone}", PUBLIC_ELB_TAG),
                opts=self._child,
            )
            public_association = aws.ec2.RouteTableAssociation(
                f"{name}-public-{i}",
                subnet_id=public.id,
                route_table_id=public_rt.id,
                opts=self._child,
            )
            self.egress.append(public_association)
            public_subnets.append(public)
            if i == 0 or config.nat_gateways == "perAz":
                eip = aws.ec2.Eip(
                    f"{name}-nat-{i}",
                    domain="vpc",
                    tags=self._named(f"{name}-nat-{zone}"),
                    opts=self._child,
                )
                nats.append(
                    aws.ec2.NatGateway(
                        f"{name}-{i}",
                        allocation_id=eip.id,
                        subnet_id=public.id,
                        tags=self._named(f"{name}-{zone}"),
                        opts=pulumi.ResourceOptions(parent=self, depends_on=[igw]),
                    )
                )
                self.egress += [eip, nats[-1]]
            private = aws.ec2.Subnet(
                f"{name}-private-{i}",
                vpc_id=vpc.id,
                cidr_block=str(private_cidr),
                availability_zone=zone,
                tags=self._named(
                    f"{name}-private-{zone}", INTERNAL_ELB_TAG, discovery_tag(self._cluster_name)
                ),
                opts=self._child,
            )
            # A single NAT serves every AZ: cheaper, but one AZ outage cuts egress.
            private_rt = aws.ec2.RouteTable(
                f"{name}-private-{i}",
                vpc_id=vpc.id,
                routes=[
                    aws.ec2.RouteTableRouteArgs(cidr_block="0.0.0.0/0", nat_gateway_id=nats[-1].id)
                ],
                tags=self._named(f"{name}-private-{zone}"),
                opts=self._child,
            )
            private_association = aws.ec2.RouteTableAssociation(
                f"{name}-private-{i}",
                subnet_id=private.id,
                route_table_id=private_rt.id,
                opts=self._child,
            )
            self.egress += [private_rt, private_association]
            private_subnets.append(private)
            control_plane_subnets.append(
                self._control_plane_subnet(name, i, zone, control_plane_cidr, vpc, private_rt)
            )
            private_rts.append(private_rt)
            self.route_table_ids.append(private_rt.id)

        self.egress += self._endpoints(name, config, vpc, private_subnets, private_rts)
        self.vpc_id = vpc.id
        self.private_subnets = [s.id for s in private_subnets]
        self.private_subnet_ids = pulumi.Output.all(*self.private_subnets)
        self.public_subnets = [s.id for s in public_subnets]
        self.public_subnet_ids = pulumi.Output.all(*self.public_subnets)
        self.control_plane_subnet_ids = pulumi.Output.all(*[s.id for s in control_plane_subnets])

    def _control_plane_subnet(self, name, i, zone, cidr, vpc, private_rt) -> aws.ec2.Subnet:
        """A subnet for the control plane's network interfaces in `zone`: untagged for
        Karpenter and load balancers, so no node, pod or load balancer gets an address in it;
        routed like the zone's private subnet (the API server reaches pods and hybrid nodes
        through it)."""
        subnet = aws.ec2.Subnet(
            f"{name}-control-plane-{i}",
            vpc_id=vpc.id,
            cidr_block=str(cidr),
            availability_zone=zone,
            tags=self._named(f"{name}-control-plane-{zone}"),
            opts=self._child,
        )
        self.egress.append(
            aws.ec2.RouteTableAssociation(
                f"{name}-control-plane-{i}",
                subnet_id=subnet.id,
                route_table_id=private_rt.id,
                opts=self._child,
            )
        )
        return subnet

    def _endpoints(self, name, config: NetworkConfig, vpc, private_subnets, private_rts):
        """`network.vpcEndpoints`: AWS APIs reached from the private subnets without the NAT.

        Interface endpoints take HTTPS from the VPC only and publish the services' usual names
        (private DNS), so SDKs need no endpoint settings.
        """
        region = aws.get_region().region
        created: list[pulumi.Resource] = []
        interface = config.interface_endpoints()
        if interface:
            group = aws.ec2.SecurityGroup(
                f"{name}-endpoints",
                vpc_id=vpc.id,
                description="VPC interface endpoints: HTTPS from the VPC",
                tags=self._named(f"{name}-endpoints"),
                opts=self._child,
            )
            https = aws.vpc.SecurityGroupIngressRule(
                f"{name}-endpoints-https",
                security_group_id=group.id,
                cidr_ipv4=str(config.cidr),
                ip_protocol="tcp",
                from_port=HTTPS,
                to_port=HTTPS,
                description="HTTPS from the VPC",
                opts=self._child,
            )
            created += [group, https]
        for service in config.vpc_endpoints:
            gateway = service in GATEWAY_ENDPOINTS
            created.append(
                aws.ec2.VpcEndpoint(
                    f"{name}-{service.replace('.', '-')}",
                    vpc_id=vpc.id,
                    service_name=f"com.amazonaws.{region}.{service}",
                    vpc_endpoint_type="Gateway" if gateway else "Interface",
                    route_table_ids=[rt.id for rt in private_rts] if gateway else None,
                    subnet_ids=None if gateway else [s.id for s in private_subnets],
                    security_group_ids=None if gateway else [group.id],
                    private_dns_enabled=None if gateway else True,
                    tags=self._named(f"{name}-{service}"),
                    opts=self._child,
                )
            )
        return created

    def _named(self, name: str, *extra: dict[str, str]) -> dict[str, str]:
        tags = {**self._tags, "Name": name}
        for more in extra:
            tags.update(more)
        return tags
