"""Network rules: no ingress open to the world, private production API endpoints, control-plane
logs, and MPI sshd reachable only from its own job."""

from collections.abc import Iterable, Mapping

from pulumi_policy import ReportViolation, ResourceValidationArgs, StackValidationArgs

from infra.core.declared import dig, listed
from policies.rules.base import config_of, in_production, world_open

LOG_TYPES = {"api", "audit", "authenticator", "controllerManager", "scheduler"}
MPIJOB = "kubernetes:kubeflow.org/v2beta1:MPIJob"
JOB_LABEL = "training-platform/job"


def ingress(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    # In production no stack file can exempt a resource from this guard.
    if not in_production(args) and args.name in config_of(args)["allowedPublicIngress"]:
        return
    kind = args.resource_type
    if kind == "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule":
        rules = [[props.get("cidrIpv4"), props.get("cidrIpv6")]]
    elif kind == "aws:ec2/securityGroupRule:SecurityGroupRule":
        if props.get("type") != "ingress":
            return
        rules = [listed(props.get("cidrBlocks")) + listed(props.get("ipv6CidrBlocks"))]
    elif kind == "aws:ec2/securityGroup:SecurityGroup":
        rules = [
            listed(rule.get("cidrBlocks")) + listed(rule.get("ipv6CidrBlocks"))
            for rule in listed(props.get("ingress"))
        ]
    else:
        return
    open_to = sorted({c for cidrs in rules for c in world_open(cidrs)})
    if open_to:
        yield (
            f"ingress effectively open to the world ({', '.join(open_to)}); outside production, "
            "allow it by name in allowedPublicIngress"
        )


def endpoint(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    if not in_production(args):
        return
    source = (
        props.get("vpcConfig") or {} if args.resource_type == "aws:eks/cluster:Cluster" else props
    )
    public = source.get("endpointPublicAccess", True)
    cidrs = listed(source.get("publicAccessCidrs")) or ["0.0.0.0/0"]
    open_to = world_open(cidrs)
    if public is not False and open_to:
        yield (
            f"production EKS endpoint is effectively public to the world ({', '.join(open_to)}): "
            "restrict publicAccessCidrs or disable public access"
        )


def control_plane_logging(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    missing = LOG_TYPES - set(listed(props.get("enabledClusterLogTypes")))
    if missing:
        yield f"control-plane log types missing: {', '.join(sorted(missing))}"


def mpi_ssh_isolated(args: StackValidationArgs, report: ReportViolation) -> None:
    policies = [
        r.props or {}
        for r in args.resources
        if r.resource_type == "kubernetes:networking.k8s.io/v1:NetworkPolicy"
    ]
    for job in (r for r in args.resources if r.resource_type == MPIJOB):
        props = job.props or {}
        name = dig(props, "metadata", "name")
        namespace = dig(props, "metadata", "namespace")
        isolated = any(
            dig(p, "metadata", "namespace") == namespace
            and dig(p, "spec", "podSelector", "matchLabels", JOB_LABEL) == name
            and "Ingress" in listed(dig(p, "spec", "policyTypes"))
            and all(
                dig(peer, "podSelector", "matchLabels", JOB_LABEL) == name
                for rule in listed(dig(p, "spec", "ingress"))
                for peer in listed(rule.get("from")) or [{}]
            )
            for p in policies
        )
        if not isolated:
            report(
                f"MPIJob {name}: no NetworkPolicy limits its sshd to the job's own pods", job.urn
            )
