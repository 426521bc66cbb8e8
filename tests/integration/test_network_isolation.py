"""Tenants stay apart on the network (issue 28, point 2): who reaches whom among two users'
DevServers, two teams' jobs, the monitoring stack and the DevServer operator, every pair and port,
computed with NetworkPolicy semantics (infra.core.tests.network_policy_rules) from what the prod
plan deploys and what the operator renders for the servers, against the matrix intended; and the
monitoring stack's one login has a password of the stack's own.
"""

import ipaddress
import json

import pytest

from devservers.api import API_VERSION, user_namespace
from devservers.component import HEALTH_PORT
from devservers.kube import DCGM_PORT, settings_from_env
from devservers.operator import METRICS_PORT
from devservers.render import POD_INDEX_LABEL, RDZV_PORTS, SSH_PORT, children
from infra.core.tests import network_policy_rules
from infra.core.tests.crd_schema import with_defaults
from infra.core.tests.network_policy_rules import NAMESPACE_NAME_LABEL, Endpoint
from infra.karpenter.karpenter import POD_LABELS as KARPENTER_POD_LABELS
from infra.stack.loading import read_stack_file
from tests.plugin import plan_of

POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
ACCOUNT = "123456789012"  # the offline plan's account (infra/core/offline.py)
# A second user beside the prod stack's carol, in another team.
DAVE = {
    "name": "dave",
    "email": "dave@example.com",
    "team": "team-a",
    "quota": {"servers": 2, "gpus": 8},
    "iamPrincipalArn": f"arn:aws:iam::{ACCOUNT}:role/dev-dave",
}

# The monitoring stack's pods as their charts and operators label them, and the ports they
# serve. Where a policy selects by label, the label is the chart's: the Prometheus operator's
# (kube-prometheus-stack 88.5.3 templates/prometheus-operator/_prometheus-operator.tpl, release
# kube-prometheus-stack; webhook port prometheusOperator.tls.internalPort, values.yaml:2846), the
# DCGM exporter's (NVIDIA/dcgm-exporter deployment/templates/_helpers.tpl selectorLabels; port
# values.yaml service.port 9400), the node monitoring agent's host engine (eks-node-monitoring-
# agent v1.7.0 templates/dcgm-daemonset.yaml; host port 5555). The others' labels decide nothing
# here: the monitoring namespace's own policy selects every pod of it.
MONITORING = "monitoring"
STACK_PODS = {
    "prometheus": ({"app.kubernetes.io/name": "prometheus"}, [9090]),
    "alertmanager": ({"app.kubernetes.io/name": "alertmanager"}, [9093]),
    "grafana": ({"app.kubernetes.io/name": "grafana"}, [3000]),
    "kube-state-metrics": ({"app.kubernetes.io/name": "kube-state-metrics"}, [8080]),
    "prometheus-operator": (
        {
            "app": "kube-prometheus-stack-operator",
            "app.kubernetes.io/name": "kube-prometheus-stack-prometheus-operator",
            "app.kubernetes.io/component": "prometheus-operator",
        },
        [10250],
    ),
    "dcgm-exporter": (
        {"app.kubernetes.io/name": "dcgm-exporter", "app.kubernetes.io/instance": "dcgm-exporter"},
        [DCGM_PORT],
    ),
}
HOST_ENGINE = ({"k8s-app": "dcgm-server", "version": "v1"}, [5555])
# The controllers in the platform's own namespaces, as their charts and overlays label them, with
# every port they listen on (webhooks, aggregated APIs, metrics, probes): Kueue (charts/kueue
# templates/manager/manager.yaml), JobSet v0.12.0 and Trainer v2.3.0 (config/components/manager,
# manifests/base/manager), the training operator v1.9.4 and the MPI operator v0.8.2
# (manifests/base/deployment.yaml), Karpenter (charts/karpenter), the DevServer operator (its
# health and metrics ports: devservers/operator.py).
CONTROLLERS = {
    "kueue": ("kueue-system", {"app.kubernetes.io/name": "kueue"}, [9443, 8082, 8443, 8081]),
    "jobset": ("kubeflow-system", {"app.kubernetes.io/name": "jobset"}, [9443, 8443, 8081]),
    "trainer": ("kubeflow-system", {"app.kubernetes.io/name": "trainer"}, [9443, 8443, 8081]),
    "training-operator": (
        "kubeflow",
        {"control-plane": "kubeflow-training-operator"},
        [9443, 8080, 8081],
    ),
    "mpi-operator": ("mpi-operator", {"app": "mpi-operator"}, [8080]),
    "karpenter": ("kube-system", KARPENTER_POD_LABELS, [8080, 8081]),
}
# What the API server calls on them (infra/core/network_policies.py from_control_plane).
API_SERVER_CALLS = {
    ("kueue", 9443),
    ("kueue", 8082),
    ("jobset", 9443),
    ("trainer", 9443),
    ("training-operator", 9443),
    ("prometheus-operator", 10250),
}
# What tenants' pods may listen on: sshd (DevServers' and MPI workers'), the torch rendezvous
# store and its spares, a port NCCL or gloo picks, a notebook.
NCCL_PORT, NOTEBOOK_PORT = 43117, 8888
SERVER_PORTS = [SSH_PORT, RDZV_PORTS[0], RDZV_PORTS[-1], NCCL_PORT, NOTEBOOK_PORT]
JOB_PORTS = [2222, 29500, NCCL_PORT]
# Addresses that are no pod: a client in the SSH load balancers' allowed range, one outside it,
# a node (a load balancer's connection arrives from one: kube-proxy gives it the node's address),
# the EKS control plane's network interface (it calls admission webhooks).
CLIENT, STRANGER = "203.0.113.7", "198.51.100.9"


@pytest.fixture(scope="module")
def plan():
    users = read_stack_file("prod")["training-platform:devServers"]["users"]
    return plan_of("prod", devServers={"users": [*users, DAVE]})


def server(name: str, owner: str, flavor: str, **spec) -> dict:
    """A DevServer as the API server stores it (its CRD's defaults filled in)."""
    return with_defaults(
        {
            "apiVersion": API_VERSION,
            "kind": "DevServer",
            "metadata": {"name": name, "namespace": user_namespace(owner), "uid": f"uid-{name}"},
            "spec": {"owner": owner, "flavor": flavor, "image": "repo/dev:1", **spec},
        }
    )


# Carol: a distributed server and a notebook; dave: a server behind an SSH load balancer.
SERVERS = [
    server(
        "ddp", "carol", "gpu-1", mode="distributed", distributed={"worldSize": 2, "backend": "nccl"}
    ),
    server("notebook", "carol", "gpu-1"),
    server("lb", "dave", "gpu-1", ssh={"serviceType": "LoadBalancer"}),
]


class World:
    """The prod plan's cluster with the servers running: pods, namespaces, policies."""

    def __init__(self, plan, monkeypatch):
        self.vpc = ipaddress.ip_network(
            read_stack_file("prod")["training-platform:network"]["cidr"]
        )
        self.addresses = (str(a) for a in self.vpc.hosts())
        subnet = plan.one("aws:ec2/subnet:Subnet", "network-control-plane-0").inputs
        self.control_plane = str(next(ipaddress.ip_network(subnet["cidrBlock"]).hosts()))
        self.namespaces = {
            n.inputs["metadata"]["name"]: {
                **n.inputs["metadata"].get("labels", {}),
                NAMESPACE_NAME_LABEL: n.inputs["metadata"]["name"],
            }
            for n in plan.of_type("kubernetes:core/v1:Namespace")
        }
        charts = (MONITORING, "kube-system", *{n for n, _, _ in CONTROLLERS.values()})
        for made_by_charts in charts:
            self.namespaces[made_by_charts] = {NAMESPACE_NAME_LABEL: made_by_charts}
        self.policies = [p.inputs for p in plan.of_type(POLICY)]
        self.pods: list[Endpoint] = []
        self.group: dict[str, str] = {}  # pod -> the workload it belongs to
        # Team namespaces: labelled with their team, not owned by a DevServer user.
        self.teams = {
            name
            for name, labels in self.namespaces.items()
            if "training-platform/team" in labels and "dev.training-platform.io/owner" not in labels
        }
        self.ports: dict[str, list[int]] = {}
        self._servers(plan, monkeypatch)
        self._jobs(plan)
        for name, (labels, ports) in STACK_PODS.items():
            self._pod(name, MONITORING, labels, ports, MONITORING)
        self._pod("dcgm-server", "kube-system", *HOST_ENGINE, "host-engine")
        for name, (namespace, labels, ports) in CONTROLLERS.items():
            self._pod(name, namespace, labels, ports, name)
        operator = plan.one("kubernetes:apps/v1:Deployment", "dev-servers-operator").inputs
        self._pod(
            "devserver-operator",
            operator["metadata"]["namespace"],
            operator["spec"]["template"]["metadata"]["labels"],
            [HEALTH_PORT, METRICS_PORT],
            "devserver-operator",
        )
        self.sources = self.pods + [
            Endpoint("ssh-client", CLIENT),
            Endpoint("stranger", STRANGER),
            Endpoint("node", next(self.addresses), node="node-other"),
            # An address of the control plane's own subnets, where EKS puts its interfaces.
            Endpoint("control-plane", self.control_plane, node="control-plane"),
        ]

    def _pod(self, name, namespace, labels, ports, group, named_ports=None) -> None:
        self.pods.append(
            Endpoint(
                name,
                next(self.addresses),
                namespace,
                dict(labels),
                node=f"node-{name}",
                named_ports=named_ports or {},
            )
        )
        self.group[name], self.ports[name] = group, ports

    def _servers(self, plan, monkeypatch) -> None:
        """Each server's children as the operator renders them with the settings the plan's
        operator Deployment gives it, and its pods as the StatefulSet controller labels them
        (apps.kubernetes.io/pod-index, statefulset.kubernetes.io/pod-name: StatefulSets,
        Kubernetes docs)."""
        operator = plan.one("kubernetes:apps/v1:Deployment", "dev-servers-operator").inputs
        (container,) = operator["spec"]["template"]["spec"]["containers"]
        for variable in container["env"]:
            monkeypatch.setenv(variable["name"], variable["value"])
        settings = settings_from_env()
        flavors = {
            f.inputs["metadata"]["name"]: {**f.inputs, "apiVersion": API_VERSION}
            for f in plan.of_type("kubernetes:dev.training-platform.io/v1alpha1:DevServerFlavor")
        }
        for manifest in SERVERS:
            rendered = children(manifest, flavors[manifest["spec"]["flavor"]], settings)
            self.policies += [c for c in rendered if c["kind"] == "NetworkPolicy"]
            (sts,) = [c for c in rendered if c["kind"] == "StatefulSet"]
            template = sts["spec"]["template"]
            (pod_container,) = template["spec"]["containers"]
            named = {p["name"]: p["containerPort"] for p in pod_container.get("ports", [])}
            server_name = manifest["metadata"]["name"]
            for index in range(sts["spec"]["replicas"]):
                pod = f"{server_name}-{index}"
                labels = {
                    **template["metadata"]["labels"],
                    POD_INDEX_LABEL: str(index),
                    "statefulset.kubernetes.io/pod-name": pod,
                }
                namespace = manifest["metadata"]["namespace"]
                self._pod(pod, namespace, labels, SERVER_PORTS, f"server {server_name}", named)

    def _jobs(self, plan) -> None:
        """Two pods of each job, from its replica templates: a PyTorchJob's workers, an MPIJob's
        launcher and a worker."""
        for kind, specs, roles in (
            ("PyTorchJob", "pytorchReplicaSpecs", ["Worker", "Worker"]),
            ("MPIJob", "mpiReplicaSpecs", ["Launcher", "Worker"]),
        ):
            group = "kubeflow.org/v1" if kind == "PyTorchJob" else "kubeflow.org/v2beta1"
            for job in plan.of_type(f"kubernetes:{group}:{kind}"):
                meta = job.inputs["metadata"]
                for index, role in enumerate(roles):
                    template = job.inputs["spec"][specs][role]["template"]
                    self._pod(
                        f"{meta['name']}-{role.lower()}-{index}",
                        meta["namespace"],
                        template["metadata"]["labels"],
                        JOB_PORTS,
                        f"job {meta['name']}",
                    )
        # A job a member of team-b submitted herself: labels of her own choosing.
        self._pod("member-job-0", "team-b", {"app": "mine"}, JOB_PORTS, "job member-job")

    def allowed(self, source: Endpoint, destination: Endpoint, port: int) -> bool:
        return network_policy_rules.allowed(
            self.policies, self.namespaces, source, destination, port
        )

    def intended(self, source: Endpoint, destination: Endpoint, port: int) -> bool:
        """What should connect: a workload's own pods to each other on any port (a server's, a
        job's, the monitoring stack's), the DevServer operator to the DCGM exporters' metrics,
        the exporters to the host engine, the control plane to the controllers' webhooks and
        aggregated APIs (nothing else reaches a controller: no tenant, no node), and to sshd of
        the server with an SSH load balancer the load balancer's sources: the allowed client
        range, and the VPC, where the node it hands the connection to is (every pod's address
        is in the VPC too)."""
        if source.namespace is not None and self.group[source.name] == self.group[destination.name]:
            return True
        # A team is one tenant: its pods (its stack jobs, the jobs its members submit) reach each
        # other; a DevServer user's servers reach only their own pods.
        if source.namespace == destination.namespace in self.teams:
            return True
        in_vpc = ipaddress.ip_address(source.ip) in self.vpc
        return (
            (destination.name, port, source.name)
            in {
                ("dcgm-exporter", DCGM_PORT, "devserver-operator"),
                ("dcgm-server", 5555, "dcgm-exporter"),
            }
            or (source.name == "control-plane" and (destination.name, port) in API_SERVER_CALLS)
            or (destination.name == "lb-0" and port == SSH_PORT and (in_vpc or source.ip == CLIENT))
        )


def test_every_connection_among_tenants_and_monitoring_is_exactly_the_intended_one(
    plan, monkeypatch
):
    # The matrix below is the policies' word; the VPC CNI makes it the network's.
    assert plan.one("eks:index:Cluster").inputs["vpcCniOptions"]["enableNetworkPolicy"] is True
    assert all(p.inputs["spec"]["policyTypes"] == ["Ingress"] for p in plan.of_type(POLICY))
    world = World(plan, monkeypatch)
    assert {p.namespace for p in world.pods} >= {
        "dev-carol", "dev-dave", "team-b", "research-jobs", MONITORING, "kube-system",
        "devservers-system", "kueue-system", "kubeflow", "kubeflow-system", "mpi-operator",
    }  # fmt: skip
    differ = [
        (source.name, destination.name, port, "allowed" if should else "refused")
        for destination in world.pods
        for source in world.sources
        if source is not destination
        for port in world.ports[destination.name]
        if world.allowed(source, destination, port)
        != (should := world.intended(source, destination, port))
    ]
    assert not differ, f"{len(differ)} connections differ from what is intended: {differ[:40]}"


def test_the_evaluator_reads_the_concepts_page_example_as_the_page_does():
    """The example of kubernetes.io/docs/concepts/services-networking/network-policies/ and what
    the page says it allows: TCP 6379 of role=db pods in `default` from role=frontend pods of
    `default`, from any pod of a namespace labelled project=myproject, and from 172.17.0.0/16
    but 172.17.1.0/24; nothing else. And its two ways of combining selectors."""
    policy = {
        "metadata": {"namespace": "default"},
        "spec": {
            "podSelector": {"matchLabels": {"role": "db"}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [
                {
                    "from": [
                        {"ipBlock": {"cidr": "172.17.0.0/16", "except": ["172.17.1.0/24"]}},
                        {"namespaceSelector": {"matchLabels": {"project": "myproject"}}},
                        {"podSelector": {"matchLabels": {"role": "frontend"}}},
                    ],
                    "ports": [{"protocol": "TCP", "port": 6379}],
                }
            ],
        },
    }
    namespaces = {
        "default": {NAMESPACE_NAME_LABEL: "default"},
        "mine": {NAMESPACE_NAME_LABEL: "mine", "project": "myproject"},
        "other": {NAMESPACE_NAME_LABEL: "other"},
    }
    db = Endpoint("db", "10.0.0.1", "default", {"role": "db"}, node="n1")

    def reaches(source: Endpoint, port: int = 6379, protocol: str = "TCP", policies=None) -> bool:
        return network_policy_rules.allowed(
            policies or [policy], namespaces, source, db, port, protocol
        )

    frontend = Endpoint("fe", "10.0.0.2", "default", {"role": "frontend"}, node="n2")
    assert reaches(frontend)
    assert not reaches(frontend, 6380) and not reaches(frontend, protocol="UDP")
    assert reaches(Endpoint("any", "10.0.0.3", "mine", {}, node="n2"))
    assert not reaches(
        Endpoint("fe-elsewhere", "10.0.0.4", "other", {"role": "frontend"}, node="n2")
    )
    assert reaches(Endpoint("outside", "172.17.0.9")) and reaches(Endpoint("o", "172.17.2.9"))
    assert not reaches(Endpoint("excepted", "172.17.1.9"))
    assert reaches(Endpoint("its-node", "10.1.0.1", node="n1"))  # the pod's own node, always
    # One element with both selectors: role=client pods in namespaces labelled user=alice.
    both = {"namespaceSelector": {"matchLabels": {"project": "myproject"}}}
    both["podSelector"] = {"matchLabels": {"role": "client"}}
    together = json.loads(json.dumps(policy))
    together["spec"]["ingress"][0]["from"] = [both]
    client_there = Endpoint("c", "10.0.0.5", "mine", {"role": "client"}, node="n2")
    assert reaches(client_there, policies=[together])
    assert not reaches(Endpoint("any", "10.0.0.3", "mine", {}, node="n2"), policies=[together])
    # No policy selects the pod: it accepts everything.
    assert reaches(
        Endpoint("x", "10.9.9.9"), 1, policies=[{**policy, "metadata": {"namespace": "other"}}]
    )


def test_grafana_admin_password_is_the_stacks_secret(prod_plan):
    stack = prod_plan.one("kubernetes:helm.sh/v3:Release", "kube-prometheus-stack")
    assert stack.inputs["values"]["grafana"]["adminPassword"] == "[secret]"
