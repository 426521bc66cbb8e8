"""Node rules: IMDSv2 with one hop, every NodePool bounded, GPU nodes tainted."""

from collections.abc import Iterable, Mapping

from pulumi_policy import ResourceValidationArgs

from infra.core.catalog import load_catalog
from infra.core.declared import dig, listed
from policies.rules.base import GPU, NODECLASS, node_pool_types, spec_of


def imds(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    kind = args.resource_type
    if kind == "eks:index:Cluster":
        # pulumi-eks' default node group is configured by the component, not by this program.
        if props.get("skipDefaultNodeGroup") is not True:
            yield "set skipDefaultNodeGroup: nodes come from groups whose IMDS settings are ours"
        return
    if kind == "aws:eks/nodeGroup:NodeGroup":
        # Without a launch template a managed node group takes EC2's default (IMDSv1 allowed).
        if not props.get("launchTemplate"):
            yield "managed node group must use a launch template that requires IMDSv2"
        return
    options = (spec_of(props) if kind == NODECLASS else props).get("metadataOptions") or {}
    hops = options.get("httpPutResponseHopLimit")
    if options.get("httpTokens") != "required" or hops not in (1, "1"):
        yield "metadataOptions must set httpTokens: required and httpPutResponseHopLimit: 1"


def nodepool_limits(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    spec = spec_of(props)
    limits = spec.get("limits") or {}
    if "replicas" in spec:
        # A static NodePool keeps `replicas` nodes and may limit nothing but `nodes` (Karpenter's
        # CRD, tests/crds/karpenter/karpenter.sh_nodepools.yaml: "Limits other than limits.nodes
        # is not supported when replicas is set"), which bounds it whole.
        if "nodes" not in limits:
            yield "static NodePool needs limits nodes"
        return
    needed = ["nodes", "cpu", "memory"]
    catalog = load_catalog()
    if any(catalog[t].gpus for t in node_pool_types(props) if t in catalog):
        needed.append(GPU)
    missing = [k for k in needed if k not in limits]
    if missing:
        yield f"NodePool needs limits {', '.join(missing)}"


def gpu_taint(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    catalog = load_catalog()
    gpu_types = [t for t in node_pool_types(props) if t in catalog and catalog[t].gpus]
    taints = listed(dig(props, "spec", "template", "spec", "taints"))
    tainted = any(t.get("key") == GPU and t.get("effect") == "NoSchedule" for t in taints)
    if gpu_types and not tainted:
        yield f"GPU NodePool ({', '.join(gpu_types)}) needs the {GPU}:NoSchedule taint"
