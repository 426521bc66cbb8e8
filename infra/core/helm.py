"""One way to install a pinned Helm chart, shared by every component that installs one."""

import pulumi
import pulumi_kubernetes as k8s

from infra.core.versions import ChartPin


def helm_release(
    name: str,
    pin: ChartPin,
    namespace: str,
    values: dict,
    opts: pulumi.ResourceOptions,
    skip_crds: bool = False,
) -> k8s.helm.v3.Release:
    """A Helm release of `pin` into `namespace`, waiting until its workloads are ready.

    helm.v3.Release (not v4 Chart) so that the release and its resolved values are an ordinary
    resource that previews, policies and the offline plan can all read.
    """
    return k8s.helm.v3.Release(
        name,
        name=name,
        chart=pin.chart,
        version=pin.version,
        repository_opts=k8s.helm.v3.RepositoryOptsArgs(repo=pin.repo) if pin.repo else None,
        namespace=namespace,
        create_namespace=True,
        atomic=True,
        cleanup_on_fail=True,
        timeout=900,
        values=values,
        skip_crds=skip_crds,
        opts=opts,
    )
