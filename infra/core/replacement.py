"""Which input changes make the providers replace a resource, written down from their source.

The offline plan has no provider to ask, so it applies these rules to the inputs two plans
record (infra/core/steps.py). A real `pulumi preview` asks the providers themselves; the
pull-request gate reads its steps instead (deploy/preview_gate.py).

Sources (read 2026-11; the pinned releases are pulumi 3.272.0, pulumi-aws 7.51.1, pulumi-eks
4.4.0, pulumi-kubernetes 4.34.2):
- pulumi-aws bridges terraform-provider-aws v6 (pulumi/pulumi-aws PR #5665 moved to v6; the
  exact tag behind 7.51.1 is at or after v6.66.0, whose new resources, such as aws_msk_channel,
  its SDK has). A `ForceNew: true` argument, or a
  CustomizeDiff that calls `d.ForceNew`, is a replacement. Files: internal/service/<svc>/<res>.go
  of hashicorp/terraform-provider-aws; where the newest revision that could be read predates v6
  (FSx for Lustre, EKS node group, S3 bucket, EC2 instance), arguments added since are not here.
- pulumi-kubernetes: provider/pkg/provider/diff.go forceNewProperties (identical at v4.32.0 and
  at master 94977969, 2026-07): `.metadata.name`, `.metadata.namespace`, and a table per kind.
  Custom resources have no entry: only a name, namespace or provider change replaces them.
- pulumi-eks: nodejs/eks/cluster/cluster.ts (master 7bf0c1b1) maps the component's inputs onto an
  aws:eks/cluster:Cluster; offline, the component stands for it.
Input paths are the camelCase names the plan records; a rule path covers everything below it.
Each rule is written down beside the integration that declares its kind (a `Kind.replace` in
infra/<name>/facts.py); this module holds the rule type, the provider-wide rules and the diff.
"""

from typing import Any

from infra.core.facts import K8S, K8S_METADATA, Facts, ReplaceRule

# Providers whose objects are not the cluster's own: a release or overlay is applied, not diffed.
NOT_OBJECTS = ("kubernetes:helm.sh/", "kubernetes:kustomize/", "kubernetes:yaml/")


def rule_for(resource_type: str, facts: Facts) -> ReplaceRule | None:
    """The replacement rule of a resource type; None where no input forces one (or the type is
    not one the rules cover: components, Helm releases). pulumi-kubernetes replaces every object
    whose name or namespace changes, besides its kind's own paths."""
    kind = facts.kind(resource_type)
    rule = kind.replace if kind else None
    if resource_type.startswith("kubernetes:") and not resource_type.startswith(NOT_OBJECTS):
        if rule is None:
            return ReplaceRule(K8S_METADATA, K8S)
        return ReplaceRule((*K8S_METADATA, *rule.force_new), rule.source, rule.custom)
    return rule


def replacing_paths(
    resource_type: str, old: dict[str, Any], new: dict[str, Any], facts: Facts
) -> list[str]:
    """The changed input paths that force a replacement of a resource of this type."""
    rule = rule_for(resource_type, facts)
    if rule is None:
        return []
    changed = changed_paths(old, new)
    hits = [p for p in changed if any(covers(rule_path, p) for rule_path in rule.force_new)]
    if rule.custom:
        hits += [p for p in rule.custom(old, new) if p not in hits]
    return hits


def covers(rule_path: str, path: str) -> bool:
    """A change at `path` falls under `rule_path` (or contains it, a whole block replaced)."""
    plain = _without_indices(path)
    return (
        plain == rule_path or plain.startswith(f"{rule_path}.") or rule_path.startswith(f"{plain}.")
    )


def _without_indices(path: str) -> str:
    return ".".join(part.split("[", 1)[0] for part in path.split("."))


def changed_paths(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Dotted paths (list items as `[i]`) where `old` and `new` differ, down to the leaves."""
    if isinstance(old, dict) and isinstance(new, dict):
        paths = []
        for key in [*old, *(k for k in new if k not in old)]:
            path = f"{prefix}.{key}" if prefix else key
            if key not in old or key not in new:
                if old.get(key) != new.get(key):
                    paths.append(path)
            else:
                paths += changed_paths(old[key], new[key], path)
        return paths
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        pairs = enumerate(zip(old, new, strict=True))
        return [p for i, (a, b) in pairs for p in changed_paths(a, b, f"{prefix}[{i}]")]
    return [] if old == new else [prefix]
