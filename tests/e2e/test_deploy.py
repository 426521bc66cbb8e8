"""What a real `pulumi up` / `pulumi destroy` does with the program, checked on the offline plan.

Each test is a class of deploy failure found upstream (pulumi engine, Karpenter, Kueue, EKS):
working directory, create/destroy ordering, finalizers, quotas that block undeclared resources,
IAM a call really needs, partitions.
"""

import fnmatch
import json
import os
import re
from pathlib import Path

import pytest
import yaml

from deploy.program import build_platform
from infra.core.nodes import (
    EFA_NODE_LABELS,
    POOL_LABEL,
    SYSTEM_NODE_LABEL,
    SYSTEM_PLACEMENT,
    SYSTEM_TOLERATION,
)
from infra.core.offline import Plan, RecordedResource, run_offline
from infra.core.paths import PROGRAM_DIR
from infra.core.versions import EFA_DEVICE_PLUGIN_CHART, KARPENTER_CHART, KARPENTER_CRD_CHART
from infra.hybrid.tests.test_hybrid import HYBRID, PRIVATE_ENDPOINT_OFF
from infra.hybrid.tests.test_hybrid_devservers import hybrid_dev_servers
from infra.hybrid.tests.test_hybrid_jobs import HYBRID_JOBS
from infra.karpenter.tests import karpenter_rules
from infra.kueue.kueue import EXCLUDED_RESOURCE_PREFIXES
from infra.kueue.queues import COVERED_RESOURCES
from infra.stack.loading import parse_stack_config
from tests.destroy_order import DestroyOrder
from tests.plugin import NO_DEV_SERVERS, ROOT, STACKS, plan_of, stack_values
from trainer import TRAINER_UID
from workloads.tests.test_trainjob import STACK_TRAINJOB

RELEASE = "kubernetes:helm.sh/v3:Release"
NODEPOOL = "kubernetes:karpenter.sh/v1:NodePool"
NODECLASS = "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass"
JOBS = ("kubernetes:kubeflow.org/v1:PyTorchJob", "kubernetes:kubeflow.org/v2beta1:MPIJob")
TRAINJOB = "kubernetes:trainer.kubeflow.org/v1alpha1:TrainJob"
RUNTIME = "kubernetes:trainer.kubeflow.org/v1alpha1:ClusterTrainingRuntime"


def depends_on(plan, resource) -> set[str]:
    """URNs `resource` depends on, directly or through others: the engine deletes it first."""
    seen, todo = set(), list(resource.dependencies)
    while todo:
        urn = todo.pop()
        if urn not in seen:
            seen.add(urn)
            found = [r for r in plan.resources if r.urn == urn]
            todo += found[0].dependencies if found else []
    return seen


def pod_templates(job: dict) -> list[dict]:
    replicas = job["spec"].get("pytorchReplicaSpecs") or job["spec"]["mpiReplicaSpecs"]
    return [r["template"] for r in replicas.values()]


def trainjob_pod_templates(plan, job: dict) -> list[dict]:
    """A TrainJob's pods: its runtime's."""
    (runtime,) = [
        r.inputs
        for r in plan.of_type(RUNTIME)
        if r.inputs["metadata"]["name"] == job["spec"]["runtimeRef"]["name"]
    ]
    replicated = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    return [j["template"]["spec"]["template"] for j in replicated]


# --- working directory ------------------------------------------------------------------------


def test_offline_plan_runs_the_program_where_pulumi_does():
    main = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())["main"]
    seen = []
    run_offline(lambda: seen.append(os.getcwd()), "dev", stack_values("dev"))
    assert seen == [str((ROOT / main).resolve())] == [str(PROGRAM_DIR)]
    assert os.getcwd() != str(PROGRAM_DIR)  # restored for the caller


@pytest.mark.parametrize("stack", STACKS)
def test_every_local_path_a_provider_reads_exists_from_the_programs_directory(stack, request):
    plan = request.getfixturevalue(f"{stack}_plan")
    paths = []

    def collect(value, key=""):
        if isinstance(value, dict):
            for k, v in value.items():
                collect(v, k)
        elif isinstance(value, list):
            for v in value:
                collect(v, key)
        elif key in {"directory", "location", "file", "files", "path"} and isinstance(value, str):
            if not re.match(r"^[a-z]+://", value):
                paths.append(value)

    # Resources whose provider reads local files (Helm values and pod specs name in-cluster paths).
    readers = ("kubernetes:kustomize/", "kubernetes:yaml/", "docker-build:")
    for resource in plan.resources:
        if resource.type.startswith(readers):
            collect(resource.inputs)
    assert len(paths) >= 3  # kustomize directories, image context and Dockerfile
    for path in paths:
        assert not Path(path).is_absolute(), f"{path}: absolute paths differ per checkout"
        assert (PROGRAM_DIR / path).exists(), f"{path} does not exist from {PROGRAM_DIR}"
    for directory in plan.of_type("kubernetes:kustomize/v2:Directory"):
        assert (PROGRAM_DIR / directory.inputs["directory"] / "kustomization.yaml").is_file()


# --- create and destroy order -----------------------------------------------------------------


@pytest.mark.parametrize("stack", STACKS)
def test_controllers_wait_for_their_nodes_and_jobs_for_their_operators(stack, request):
    """Create order: a controller's Helm release waits (atomic) for its pods to be ready, so
    it needs the system nodes and the Pod Identity agent first; a job needs its CRD."""
    plan = request.getfixturevalue(f"{stack}_plan")
    prerequisites = {
        plan.one("aws:eks/nodeGroup:NodeGroup", "cluster-system").urn,
        plan.one("aws:eks/addon:Addon", "cluster-eks-pod-identity-agent").urn,
    }
    controllers = [
        plan.one(RELEASE, "karpenter"),
        plan.one(RELEASE, "kueue"),
        *plan.of_type("kubernetes:kustomize/v2:Directory"),
        *[a for a in plan.of_type("aws:eks/addon:Addon") if a.name.endswith("-csi")],
    ]
    assert len(controllers) >= 6
    for controller in controllers:
        assert prerequisites <= depends_on(plan, controller), controller.name
    for job in [r for t in (*JOBS, TRAINJOB) for r in plan.of_type(t)]:
        for operator in plan.of_type("kubernetes:kustomize/v2:Directory"):
            assert operator.urn in depends_on(plan, job)
    # A runtime needs the Trainer's CRDs and validating webhook.
    trainer = plan.one("kubernetes:kustomize/v2:Directory", "kubeflow-trainer")
    assert plan.of_type(RUNTIME)
    for runtime in plan.of_type(RUNTIME):
        assert trainer.urn in runtime.dependencies


# What each controller calls while it drains or finalizes, as the plan's resources, written from
# upstream (not from the program's edges). Each need maps a URN to why it is needed.
#
# - Karpenter at KARPENTER_CHART (pkg/controllers/node/termination/controller.go
#   `finalize`): a NodePool's NodeClaims are drained (`awaitDrain`), then their VolumeAttachments
#   must be gone (`awaitVolumeDetachment`: only the EBS CSI controller's external-attacher
#   detaches them, aws-ebs-csi-driver v1.51.1 docs/faq.md; otherwise it waits for them, the pools
#   having no terminationGracePeriod), then the instance is terminated (ec2:TerminateInstances); the
#   EC2NodeClass finalizer waits for its NodeClaims and deletes launch templates. It polls the
#   interruption queue (SQS) throughout, gets its credentials from Pod Identity (the agent calls
#   eks-auth with the node's role: EKS user guide service-accounts.adoc, "For private clusters,
#   the eks-auth endpoint in AWS PrivateLink is required"), and the draining nodes' kubelets keep
#   authenticating with the Karpenter node role (access entry, instance profile, policies).
# - Kueue at KUEUE_CHART: Workloads (jobframework/utils.go) and ClusterQueues/ResourceFlavors
#   (core/clusterqueue_controller.go, resourceflavor_controller.go) carry
#   `kueue.x-k8s.io/resource-in-use`; pods of the pod and statefulset integrations (DevServers)
#   carry `kueue.x-k8s.io/managed` (jobs/pod/constants). Only a running Kueue removes them, so a
#   namespace holding them is deleted only while Kueue runs.
# - CSI drivers: a claim's PersistentVolume with reclaimPolicy Delete is deleted by the driver's
#   controller (EBS DeleteVolume, EFS DeleteAccessPoint), and a pod's volume is unmounted by the
#   driver's node plugin, which for EFS and Lustre needs the file system's servers reachable.
#   The controllers call AWS APIs by name through cluster DNS (the EBS chart sets no dnsPolicy:
#   ClusterFirst), so CoreDNS too.
# - The system node group, where every controller runs (the Helm values pin them there): AWS
#   deletes a managed node group's instances and ENIs with its role's permissions, so the role's
#   policies must outlive the group (terraform-provider-aws docs r/eks_node_group, "Ensure that
#   IAM Role permissions are created before and deleted after EKS Node Group handling"; the
#   aws.eks.NodeGroup docs are generated from it). Nodes reach AWS and image registries through
#   the VPC's egress: NAT gateways and their routes, or VPC endpoints.
# - The local-path provisioner (rancher/local-path-provisioner v0.0.37, provisioner.go deleteFor
#   and createHelperPod): a deleted claim's PersistentVolume (reclaimPolicy Delete) is deleted by
#   its controller, which runs on the system nodes and first removes the home's directory with a
#   helper pod in its own namespace, pinned to the home's machine. That pod, like the servers'
#   pods a namespace deletion waits for, runs only while the machine's kubelet authenticates (the
#   hybrid node role's HYBRID_LINUX access entry: EKS user guide, "Prepare credentials for hybrid
#   nodes"), reaches the API server (through the WireGuard gateway) and gets a pod network from
#   Cilium, the one CNI on hybrid nodes.
# The DevServer operator is not among them: issue 20.3 takes its finalizer away (its rights in a
# user namespace are a RoleBinding inside that namespace, gone with it, so no order could help).
# The GPU registration watcher (gpuwatch/watcher.py) is the other way round: it deletes the
# NodeClaims of the GPU pools its CronJob names (--pools), which Karpenter then drains, so it
# must be gone before those NodePools and Karpenter start going; and it calls the API with its
# ServiceAccount's RBAC, which must outlive it (or every run until then is refused).

CRONJOB = "kubernetes:batch/v1:CronJob"
CSI_ADDONS = {
    "ebs.csi.aws.com": "aws-ebs-csi-driver",
    "efs.csi.aws.com": "aws-efs-csi-driver",
    "fsx.csi.aws.com": "aws-fsx-csi-driver",
}
EGRESS_TYPES = {
    "aws:ec2/natGateway:NatGateway",
    "aws:ec2/eip:Eip",
    "aws:ec2/internetGateway:InternetGateway",
    "aws:ec2/routeTable:RouteTable",
    "aws:ec2/route:Route",
    "aws:ec2/routeTableAssociation:RouteTableAssociation",
    "aws:ec2/vpcEndpoint:VpcEndpoint",
    "aws:ec2/securityGroup:SecurityGroup",
    "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule",
}
# What a node plugin talks to while it unmounts a volume of each driver.
FILE_SERVERS = {
    "efs.csi.aws.com": "aws:efs/mountTarget:MountTarget",
    "fsx.csi.aws.com": "aws:fsx/lustreFileSystem:LustreFileSystem",
}
INGRESS_RULE = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
NAMESPACE = "kubernetes:core/v1:Namespace"
CLAIM = "kubernetes:core/v1:PersistentVolumeClaim"
FLAVOR = "kubernetes:dev.training-platform.io/v1alpha1:DevServerFlavor"
# main.go DefaultProvisionerName of rancher/local-path-provisioner v0.0.37.
LOCAL_PATH = "rancher.io/local-path"


def selects(selector: dict, labels: dict) -> bool:
    """A Kubernetes label selector (matchLabels, matchExpressions) applied to `labels`."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator = expression["key"], expression["operator"]
        listed = labels.get(key) in expression.get("values", [])
        present = key in labels
        matched = {
            "Exists": present,
            "DoesNotExist": not present,
            "In": listed,
            "NotIn": not listed,
        }
        if not matched[operator]:
            return False
    return True


def role_name(role_arn: str) -> str:
    return role_arn.rsplit("/", 1)[1]


class ControllerNeeds:
    """What each controller needs at run time, found in a plan by what the resources are."""

    def __init__(self, plan):
        self.plan = plan

    def _where(self, type_, **inputs) -> list:
        return [
            r
            for r in self.plan.of_type(type_)
            if all(r.inputs.get(k) == v for k, v in inputs.items())
        ]

    def _addon(self, name: str):
        (addon,) = self._where("aws:eks/addon:Addon", addonName=name)
        return addon

    def _grants(self, role: str) -> list:
        return self._where(
            "aws:iam/rolePolicyAttachment:RolePolicyAttachment", role=role
        ) + self._where("aws:iam/rolePolicy:RolePolicy", role=role)

    def role_grants(self, role: str, why: str) -> dict[str, str]:
        """The policies attached to (or inlined in) the role named `role`."""
        grants = self._grants(role)
        assert grants, f"no policies on role {role}"
        return {g.urn: f"{why}: {g.name}" for g in grants}

    def pod_identity(self, role_arn: str, who: str) -> dict[str, str]:
        agent = self._addon("eks-pod-identity-agent")
        return {
            agent.urn: f"{who}'s credentials (Pod Identity agent)",
            **self.role_grants(role_name(role_arn), f"{who}'s permissions"),
        }

    def egress(self) -> dict[str, str]:
        (network,) = self.plan.of_type("training-platform:infra:Network")
        return {
            r.urn: f"egress to AWS APIs and registries: {r.name}"
            for r in self.plan.resources
            if r.parent == network.urn and r.type in EGRESS_TYPES
        }

    def system_nodes(self) -> dict[str, str]:
        (group,) = self.plan.of_type("aws:eks/nodeGroup:NodeGroup")
        (cluster,) = self.plan.of_type("eks:index:Cluster")
        return {
            group.urn: "the system nodes the controller runs on",
            **self.role_grants(role_name(group.inputs["nodeRoleArn"]), "system node kubelet"),
            **self.egress(),
            cluster.urn: "the cluster",
        }

    def karpenter(self) -> dict[str, str]:
        release = self.plan.one(RELEASE, "karpenter")
        (association,) = self._where(
            "aws:eks/podIdentityAssociation:PodIdentityAssociation",
            serviceAccount=release.inputs["values"]["serviceAccount"]["name"],
            namespace=release.inputs["namespace"],
        )
        queue_name = release.inputs["values"]["settings"]["interruptionQueue"]
        (queue,) = self._where("aws:sqs/queue:Queue", name=queue_name)
        (queue_policy,) = [
            p
            for p in self.plan.of_type("aws:sqs/queuePolicy:QueuePolicy")
            if json.loads(p.inputs["policy"])["Statement"][0]["Resource"].endswith(f":{queue_name}")
        ]
        needs = {
            release.urn: "the Karpenter controller",
            self.plan.one(RELEASE, "karpenter-crd").urn: "Karpenter's CRDs",
            association.urn: "Karpenter's Pod Identity association",
            queue.urn: "the interruption queue Karpenter polls",
            queue_policy.urn: "the interruption queue's policy",
            **self.pod_identity(association.inputs["roleArn"], "Karpenter"),
            **self.system_nodes(),
        }
        # The nodes being drained: their kubelets authenticate with the node role.
        for node_class in self.plan.of_type(NODECLASS):
            (profile,) = self._where(
                "aws:iam/instanceProfile:InstanceProfile",
                name=node_class.inputs["spec"]["instanceProfile"],
            )
            node_role = profile.inputs["role"]
            (access,) = [
                a
                for a in self._where("aws:eks/accessEntry:AccessEntry", type="EC2_LINUX")
                if a.inputs["principalArn"].endswith(f":role/{node_role}")
            ]
            needs[profile.urn] = "the draining nodes' instance profile"
            needs[access.urn] = "the draining nodes' access entry"
            needs.update(self.role_grants(node_role, "the draining nodes' kubelets"))
        return needs

    def gpu_registration_watch(self, cronjob) -> dict[str, str]:
        pod = cronjob.inputs["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        subject = {
            "kind": "ServiceAccount",
            "name": pod["serviceAccountName"],
            "namespace": cronjob.inputs["metadata"]["namespace"],
        }
        needs = {}
        for account in self._where("kubernetes:core/v1:ServiceAccount"):
            if account.inputs["metadata"] == {k: subject[k] for k in ("name", "namespace")}:
                needs[account.urn] = "the watcher's ServiceAccount"
        for kind in ("ClusterRoleBinding", "RoleBinding"):
            for binding in self._where(f"kubernetes:rbac.authorization.k8s.io/v1:{kind}"):
                if subject in binding.inputs["subjects"]:
                    role = binding.inputs["roleRef"]
                    (granted,) = [
                        r
                        for r in self._where(
                            f"kubernetes:rbac.authorization.k8s.io/v1:{role['kind']}"
                        )
                        if r.inputs["metadata"]["name"] == role["name"]
                        and r.inputs["metadata"].get("namespace")
                        == binding.inputs["metadata"].get("namespace")
                    ]
                    needs[binding.urn] = f"the watcher's rights: {binding.name}"
                    needs[granted.urn] = f"the watcher's rights: {granted.name}"
        (args,) = [c["args"] for c in pod["containers"]]
        pools = next(a for a in args if a.startswith("--pools=")).split("=", 1)[1].split(",")
        for pool in self.plan.of_type(NODEPOOL):
            if pool.inputs["metadata"]["name"] in pools:
                needs[pool.urn] = f"the NodePool {pool.name} whose NodeClaims the watcher deletes"
        release = self.plan.one(RELEASE, "karpenter")
        needs[release.urn] = "Karpenter, which drains the NodeClaims the watcher deletes"
        return needs

    def kueue(self) -> dict[str, str]:
        return {
            self.plan.one(RELEASE, "kueue").urn: "Kueue, which removes its finalizers",
            **self.system_nodes(),
        }

    def csi(self, provisioner: str) -> dict[str, str]:
        addon = self._addon(CSI_ADDONS[provisioner])
        driver = addon.inputs["addonName"]
        (association,) = addon.inputs["podIdentityAssociations"]
        needs = {
            addon.urn: f"{driver}: controller and node plugin",
            self._addon("coredns").urn: f"{driver} resolves AWS API names through cluster DNS",
            **self.system_nodes(),
        }
        # A controller whose role grants nothing (EFS's: static access points) calls no AWS API.
        if self._grants(role_name(association["roleArn"])):
            needs.update(self.pod_identity(association["roleArn"], driver))
        # The file system's servers, reachable while a node plugin unmounts it.
        for server in self.plan.of_type(FILE_SERVERS.get(provisioner, "")):
            needs[server.urn] = f"{driver}: the file system's servers"
            groups = server.inputs.get("securityGroups") or server.inputs["securityGroupIds"]
            for rule in self.plan.of_type(INGRESS_RULE):
                if rule.inputs["securityGroupId"] in groups:
                    needs[rule.urn] = f"{driver}: the servers' port {rule.inputs['fromPort']}"
        return needs

    def hybrid_kubelets(self) -> dict[str, str]:
        """What a pod on the machines needs to start or stop: their kubelets' identity, the way
        to the API server and the CNI."""
        (access,) = self._where("aws:eks/accessEntry:AccessEntry", type="HYBRID_LINUX")
        (gateway,) = self.plan.of_type("aws:ec2/instance:Instance")
        return {
            access.urn: "the machines' kubelets authenticate as the hybrid node role",
            **self.role_grants(role_name(access.inputs["principalArn"]), "the machines' kubelets"),
            gateway.urn: "the WireGuard gateway the machines reach the API server through",
            self.plan.one(RELEASE, "cilium").urn: "Cilium, the pod network on the machines",
        }

    def local_path(self) -> dict[str, str]:
        (install,) = [
            d
            for d in self.plan.of_type("kubernetes:kustomize/v2:Directory")
            if any(
                "/rancher/local-path-provisioner/" in resource
                for resource in yaml.safe_load(
                    (PROGRAM_DIR / d.inputs["directory"] / "kustomization.yaml").read_text()
                )["resources"]
            )
        ]
        return {
            install.urn: "the local-path provisioner deletes the volume, its helper pod the home",
            **self.system_nodes(),
            **self.hybrid_kubelets(),
        }

    def node_kubelets(self, pool: str) -> dict[str, str]:
        """What a pod on `pool`'s nodes needs to be deleted: the kubelets there, which confirm
        it. A NodePool (or its EC2NodeClass) deleted first has Karpenter drain nodes whose
        pods carry karpenter.sh/do-not-disrupt, which blocks the drain for as long as they run
        (the pools have no terminationGracePeriod); on the hybrid machines, what their kubelets
        need."""
        if pool == "hybrid":
            return self.hybrid_kubelets()
        return {
            r.urn: f"the kubelets of pool {pool}'s nodes, which confirm the pods' deletion"
            for r in self.plan.of_type(NODEPOOL) + self.plan.of_type(NODECLASS)
            if r.inputs["metadata"]["name"] == pool
        }

    def pools(self) -> list[str]:
        """Every pool a pod of a team or DevServer namespace may run on."""
        names = [p.inputs["metadata"]["name"] for p in self.plan.of_type(NODEPOOL)]
        return names + (["hybrid"] if self.plan.of_type("aws:ec2/instance:Instance") else [])

    def provisioner(self, name: str) -> dict[str, str]:
        """What a StorageClass's provisioner needs to delete and unmount its volumes."""
        return self.local_path() if name == LOCAL_PATH else self.csi(name)

    def claim_driver(self, claim) -> str:
        """The CSI driver serving a PersistentVolumeClaim: its StorageClass's provisioner, or
        its pre-bound PersistentVolume's driver."""
        spec = claim.inputs["spec"]
        if spec.get("storageClassName"):
            return self.storage_class_provisioner(spec["storageClassName"])
        (volume,) = [
            v
            for v in self.plan.of_type("kubernetes:core/v1:PersistentVolume")
            if v.inputs["metadata"]["name"] == spec["volumeName"]
        ]
        return volume.inputs["spec"]["csi"]["driver"]

    def storage_class_provisioner(self, name: str) -> str:
        (storage_class,) = [
            s
            for s in self.plan.of_type("kubernetes:storage.k8s.io/v1:StorageClass")
            if s.inputs["metadata"]["name"] == name
        ]
        return storage_class.inputs["provisioner"]


CRD = "kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition"
# The DevServer operator renders a StatefulSet (Kueue's statefulset integration) per server.
POD_OWNING_CRDS = {"devservers.dev.training-platform.io"}


def must_outlive(plan) -> list[tuple[object, dict[str, str]]]:
    """(object something must drain or finalize, what must be deleted only after it)."""
    needs = ControllerNeeds(plan)
    drained = []
    # NodePools and EC2NodeClasses: Karpenter terminates their instances once volumes detach.
    for node_object in plan.of_type(NODEPOOL) + plan.of_type(NODECLASS):
        drained.append((node_object, {**needs.karpenter(), **needs.csi("ebs.csi.aws.com")}))
    # Kueue's own objects and the jobs whose Workloads carry its finalizer; a job's pods are
    # deleted by the kubelets of its pool's nodes.
    for resource in plan.resources:
        if resource.type.startswith("kubernetes:kueue.x-k8s.io/"):
            drained.append((resource, needs.kueue()))
        elif resource.type in (*JOBS, TRAINJOB):
            templates = (
                trainjob_pod_templates(plan, resource.inputs)
                if resource.type == TRAINJOB
                else pod_templates(resource.inputs)
            )
            pools = {t["spec"]["nodeSelector"][POOL_LABEL] for t in templates}
            job_needs = needs.kueue()
            for pool in pools:
                job_needs.update(needs.node_kubelets(pool))
            drained.append((resource, job_needs))
    # Claims: their driver deletes the volume and unmounts it.
    claims = plan.of_type(CLAIM)
    for claim in claims:
        drained.append((claim, needs.csi(needs.claim_driver(claim))))
    # Namespaces Kueue manages (its managedJobsNamespaceSelector): Kueue's finalizers on the
    # pods and Workloads in them, the drivers of their claims; DevServer namespaces (the ones
    # the operator watches) also hold the servers' homes, of every flavor's home StorageClass.
    kueue = plan.one(RELEASE, "kueue").inputs["values"]["managerConfig"]
    selector = yaml.safe_load(kueue["controllerManagerConfigYaml"])["managedJobsNamespaceSelector"]
    operators = [
        container
        for d in plan.of_type("kubernetes:apps/v1:Deployment")
        if d.name == "dev-servers-operator"
        for container in d.inputs["spec"]["template"]["spec"]["containers"]
    ]
    home_classes = {f.inputs["spec"]["homeStorageClass"] for f in plan.of_type(FLAVOR)}
    for namespace in plan.of_type(NAMESPACE):
        metadata = namespace.inputs["metadata"]
        if not selects(selector, metadata.get("labels", {})):
            continue
        namespace_needs = needs.kueue()
        # Its pods may run on any pool's nodes (the platform queue admits every flavor).
        for pool in needs.pools():
            namespace_needs.update(needs.node_kubelets(pool))
        for claim in claims:
            if claim.inputs["metadata"]["namespace"] == metadata["name"]:
                namespace_needs.update(needs.csi(needs.claim_driver(claim)))
        for container in operators:
            watched = [
                a.split("=", 1)[1] for a in container["args"] if a.startswith("--namespace=")
            ]
            if any(fnmatch.fnmatch(metadata["name"], pattern) for pattern in watched):
                for home in home_classes:
                    provisioner = needs.storage_class_provisioner(home)
                    namespace_needs.update(needs.provisioner(provisioner))
        drained.append((namespace, namespace_needs))
    # CRDs whose objects own pods Kueue manages: deleting the CRD deletes every DevServer, and
    # the garbage collector their StatefulSets and pods (Kueue's finalizers, the kubelets).
    for crd in plan.of_type(CRD):
        if crd.inputs["metadata"]["name"] in POD_OWNING_CRDS:
            crd_needs = needs.kueue()
            for pool in needs.pools():
                crd_needs.update(needs.node_kubelets(pool))
            drained.append((crd, crd_needs))
    for cronjob in plan.of_type(CRONJOB):
        if cronjob.name == "gpu-registration-watch":
            drained.append((cronjob, needs.gpu_registration_watch(cronjob)))
    # The system node group: AWS deletes its instances and ENIs with its role's permissions.
    (group,) = plan.of_type("aws:eks/nodeGroup:NodeGroup")
    drained.append((group, needs.role_grants(role_name(group.inputs["nodeRoleArn"]), "EKS")))
    return drained


def destroy_cuts_while_draining(plan) -> list[str]:
    order = DestroyOrder.of(plan)
    problems = []
    for resource, needed in must_outlive(plan):
        for urn in order.not_outlived(resource.urn, needed):
            problems.append(f"{resource.type.split(':')[-1]} {resource.name}: {needed[urn]}")
    return problems


def recorded(name, *dependencies, parent="", provider="", custom=True, type_="test:index:R"):
    return RecordedResource(
        f"urn:{type_}::{name}", type_, name, parent, provider, list(dependencies), {}, custom
    )


def test_destroy_order_follows_the_engines_rules():
    """pkg/resource/graph DependenciesOf and deploy ScheduleDeletes, on a hand-made state."""
    vpc = recorded("vpc")
    subnet = recorded("subnet", vpc.urn)
    provider = recorded("k8s", type_="pulumi:providers:kubernetes")
    component = recorded("pools", custom=False, type_="training-platform:infra:NodePools")
    pool = recorded("pool", parent=component.urn, provider=f"{provider.urn}::id-1")
    remote = recorded("eks", subnet.urn, custom=False, type_="eks:index:Cluster")
    addon = recorded("addon", remote.urn, "urn:aws:eks/cluster:Cluster::invisible-child")
    lone = recorded("lone")
    plan = Plan("t", [vpc, subnet, provider, component, pool, remote, addon, lone])
    order = DestroyOrder.of(plan)
    assert order.deleted_before(pool.urn, component.urn)  # children before their parent
    assert order.deleted_before(pool.urn, provider.urn)  # resources before their provider
    assert order.deleted_before(addon.urn, remote.urn)  # a remote component counts
    assert order.deleted_before(addon.urn, vpc.urn)  # and what it depends on
    assert not order.deleted_before(pool.urn, vpc.urn)  # no path, no promise
    # Antichains by longest chain, run from the longest: `lone`, with neither dependents nor
    # dependencies, goes in the last wave, not the first.
    invisible = "urn:aws:eks/cluster:Cluster::invisible-child"
    assert [set(wave) for wave in order.waves()] == [
        {addon.urn},
        {remote.urn},
        {pool.urn, subnet.urn},
        {component.urn, provider.urn, vpc.urn, lone.urn, invisible},
    ]
    # The SDK expands a local component into its children; naming one is a harness bug.
    naming_component = recorded("bad", component.urn)
    with pytest.raises(AssertionError, match="local component"):
        DestroyOrder.of(Plan("t", [component, naming_component]))


def test_the_program_sets_no_deleted_with():
    """The offline harness does not record `deletedWith` (an engine edge): nothing may use it."""
    for folder in ("infra", "workloads"):
        for path in (ROOT / folder).rglob("*.py"):
            assert "deleted_with" not in path.read_text(), path


@pytest.fixture(scope="module")
def hybrid_fsx_plan():
    """dev with hybrid nodes, DevServers (homes on the machines too), FSx on and a TrainJob:
    every drain path at once."""
    return plan_of(
        "dev",
        hybrid=HYBRID,
        cluster=PRIVATE_ENDPOINT_OFF,
        storage={"fsx": {"enabled": True}},
        devServers=hybrid_dev_servers(),
        jobs=[*stack_values("dev")["training-platform:jobs"], *HYBRID_JOBS, STACK_TRAINJOB],
    )


@pytest.mark.parametrize("stack", [*STACKS, "hybrid_fsx"])
def test_destroy_deletes_what_is_drained_before_what_the_drain_needs(stack, request):
    plan = request.getfixturevalue(f"{stack}_plan")
    drained = must_outlive(plan)
    kinds = {resource.type for resource, _ in drained}
    assert {
        NODEPOOL,
        NODECLASS,
        NAMESPACE,
        CLAIM,
        CRONJOB,
        CRD,
        "aws:eks/nodeGroup:NodeGroup",
    } <= kinds
    problems = destroy_cuts_while_draining(plan)
    assert not problems, "may be deleted before what needs it:\n" + "\n".join(problems)


def test_fsx_is_created_after_its_security_group_opens_lustre(prod_plan):
    file_system = prod_plan.one("aws:fsx/lustreFileSystem:LustreFileSystem")
    rules = [
        r
        for r in prod_plan.of_type("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")
        + prod_plan.of_type("aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule")
        if r.name.startswith("fsx-")
    ]
    assert {r.inputs["fromPort"] for r in rules} == {988, 1018}
    assert {r.urn for r in rules} <= set(file_system.dependencies)


# --- Kueue admits what jobs ask for -----------------------------------------------------------


@pytest.mark.parametrize("stack", STACKS)
def test_every_resource_a_job_pod_requests_is_queued_for_or_excluded(stack, request):
    """Kueue (KUEUE_CHART, BlockUndeclared) never admits a pod asking for an undeclared resource."""
    plan = request.getfixturevalue(f"{stack}_plan")
    release = plan.one(RELEASE, "kueue").inputs["values"]
    config = yaml.safe_load(release["managerConfig"]["controllerManagerConfigYaml"])
    excluded = config["resources"]["excludeResourcePrefixes"]
    assert excluded == EXCLUDED_RESOURCE_PREFIXES
    requested = {
        name
        for job in [r for t in JOBS for r in plan.of_type(t)]
        for template in pod_templates(job.inputs)
        for container in template["spec"]["containers"]
        for name in container["resources"]["requests"]
    }
    assert "vpc.amazonaws.com/efa" in requested or stack != "dev"
    for name in requested:
        assert name in COVERED_RESOURCES or name.startswith(tuple(excluded)), name


@pytest.mark.parametrize("stack", STACKS)
def test_job_pods_are_never_best_effort_and_fit_their_node_and_quota(stack, request):
    plan = request.getfixturevalue(f"{stack}_plan")
    config = parse_stack_config(stack_values(stack), stack)
    pools = {p.name: p for p in config.node_pools}
    for job in config.jobs:
        pool = pools[job.node_pool]
        (resource,) = [
            r for t in JOBS for r in plan.of_type(t) if r.inputs["metadata"]["name"] == job.name
        ]
        worker = pod_templates(resource.inputs)[-1]["spec"]["containers"][0]["resources"]
        cpu = int(worker["requests"]["cpu"])
        memory = int(worker["requests"]["memory"].removesuffix("Gi"))
        smallest_cpu = min(t.vcpu for t in pool.types)
        smallest_memory = min(t.memory_gib for t in pool.types)
        assert 0 < cpu < smallest_cpu and 0 < memory < smallest_memory, job.name
        assert worker["limits"]["memory"] == worker["requests"]["memory"]
        ceiling = pool.ceiling()
        assert cpu * job.max_nodes <= ceiling.vcpu - 1  # room for an MPI launcher
        assert memory * job.max_nodes <= ceiling.memory_gib - 2


# --- controllers on the system nodes ----------------------------------------------------------


def test_controllers_run_on_the_tainted_system_nodes(dev_plan):
    karpenter = dev_plan.one(RELEASE, "karpenter").inputs["values"]
    assert karpenter["nodeSelector"] == SYSTEM_NODE_LABEL
    assert karpenter["tolerations"] == [SYSTEM_TOLERATION]
    kueue = dev_plan.one(RELEASE, "kueue").inputs["values"]["controllerManager"]
    assert {k: kueue[k] for k in SYSTEM_PLACEMENT} == SYSTEM_PLACEMENT
    # Leader election with a spare and a PDB: draining a system node never stops admission.
    assert kueue["replicas"] == 2
    assert kueue["podDisruptionBudget"] == {"enabled": True, "minAvailable": 1}
    csi = {
        a.inputs["addonName"]: a.inputs
        for a in dev_plan.of_type("aws:eks/addon:Addon")
        if a.name.endswith("-csi")
    }
    assert set(csi) == {"aws-ebs-csi-driver", "aws-efs-csi-driver"}
    # Pinned to the system nodes where the add-on's configuration schema has the key (a key
    # outside it fails CreateAddon; deploy.preflight checks them); EFS's controller tolerates the
    # system taint by default. EBS's node agent may write no Node.
    ebs = json.loads(csi["aws-ebs-csi-driver"]["configurationValues"])
    assert ebs == {
        "controller": {"nodeSelector": SYSTEM_NODE_LABEL},
        "node": {"serviceAccount": {"disableMutation": True}},
    }
    assert "configurationValues" not in csi["aws-efs-csi-driver"]


# --- Karpenter: complete policy, upgradable CRDs, bounded drains, EFA placement ----------------


def test_karpenter_crds_come_from_the_crd_chart_at_the_controller_version(dev_plan):
    crds = dev_plan.one(RELEASE, "karpenter-crd").inputs
    controller = dev_plan.one(RELEASE, "karpenter").inputs
    assert (crds["chart"], crds["version"]) == (KARPENTER_CRD_CHART.chart, KARPENTER_CHART.version)
    assert controller["skipCrds"] is True and crds.get("skipCrds") is not True


def test_karpenter_controller_policy_has_what_v1_14_calls(dev_plan):
    policy = json.loads(
        dev_plan.one("aws:iam/rolePolicy:RolePolicy", "karpenter-controller").inputs["policy"]
    )
    actions = {
        a
        for s in policy["Statement"]
        for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])
    }
    assert {
        "ec2:DescribeInstanceStatus",
        "ec2:DescribePlacementGroups",
        "iam:ListInstanceProfiles",
        "iam:GetInstanceProfile",
        "arc-zonal-shift:GetManagedResource",
    } <= actions
    (launch,) = [
        s for s in policy["Statement"] if s["Sid"] == "AllowScopedEC2InstanceAccessActions"
    ]
    assert any(r.endswith(":placement-group/*") for r in launch["Resource"])


def server_pod_annotations(plan: Plan) -> dict:
    """A DevServer pod's annotations, as the operator renders it for the plan's first flavor."""
    from devservers.render import pod_template
    from devservers.tests.test_devservers_render import server

    flavor = plan.of_type("kubernetes:dev.training-platform.io/v1alpha1:DevServerFlavor")[0]
    name = flavor.inputs["metadata"]["name"]
    return pod_template(server(flavor=name), flavor.inputs)["metadata"]["annotations"]


@pytest.mark.parametrize("stack", STACKS)
def test_drift_never_takes_a_node_from_under_a_job_or_a_devserver(stack, request):
    """An upgrade or a template edit drifts nodes; a running job's or server's pod keeps its node
    (infra/karpenter/tests/karpenter_rules.py drift_may_disrupt) until it ends or deploy.roll
    moves it."""
    plan = request.getfixturevalue(f"{stack}_plan")
    pods = [
        replica["template"]["metadata"]["annotations"]
        for job in plan.resources
        if job.type.startswith("kubernetes:kubeflow.org/")
        for key in ("pytorchReplicaSpecs", "mpiReplicaSpecs")
        for replica in (job.inputs["spec"].get(key) or {}).values()
    ]
    server = server_pod_annotations(plan)
    assert pods and server
    for pool in plan.of_type(NODEPOOL):
        for annotations in [*pods, server]:
            assert not karpenter_rules.drift_may_disrupt(pool.inputs["spec"], annotations)


def test_efa_pools_get_one_az_a_cluster_placement_group_and_the_efa_device_plugin(dev_plan):
    pools = {p.inputs["metadata"]["name"]: p.inputs["spec"] for p in dev_plan.of_type(NODEPOOL)}
    classes = {c.inputs["metadata"]["name"]: c.inputs["spec"] for c in dev_plan.of_type(NODECLASS)}
    zone = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-west-2a"]}
    assert zone in pools["gpu-large"]["template"]["spec"]["requirements"]
    assert pools["gpu-large"]["template"]["metadata"]["labels"].items() >= EFA_NODE_LABELS.items()
    (group,) = dev_plan.of_type("aws:ec2/placementGroup:PlacementGroup")
    assert group.inputs["strategy"] == "cluster"
    assert classes["gpu-large"]["placementGroupSelector"] == {"name": group.inputs["name"]}
    for other in ("gpu-small", "cpu"):
        assert "placementGroupSelector" not in classes[other]
        assert "topology.kubernetes.io/zone" not in json.dumps(pools[other])
        assert "training-platform/efa" not in pools[other]["template"]["metadata"]["labels"]
    plugin = dev_plan.one(RELEASE, "aws-efa-k8s-device-plugin").inputs
    assert (plugin["chart"], plugin["version"]) == (
        EFA_DEVICE_PLUGIN_CHART.chart,
        EFA_DEVICE_PLUGIN_CHART.version,
    )
    assert plugin["values"]["nodeSelector"] == EFA_NODE_LABELS
    without_efa = plan_of(
        "dev",
        nodePools=[
            p for p in stack_values("dev")["training-platform:nodePools"] if not p.get("efa")
        ],
        jobs=[j for j in stack_values("dev")["training-platform:jobs"] if j["kind"] != "MPIJob"],
        devServers=NO_DEV_SERVERS,
    )
    assert not [r for r in without_efa.of_type(RELEASE) if r.name == "aws-efa-k8s-device-plugin"]
    assert not without_efa.of_type("aws:ec2/placementGroup:PlacementGroup")
    # GPU pools without EFA keep their device plugin and GPU metrics.
    releases = {r.name for r in without_efa.of_type(RELEASE)}
    assert {"nvidia-device-plugin", "dcgm-exporter"} <= releases


def test_efa_image_target_ships_libfabric_and_aws_ofi_nccl():
    dockerfile = (ROOT / "trainer" / "Dockerfile").read_text()
    efa_stage = dockerfile.split("AS efa", 1)[1]
    assert "efa_installer.sh" in efa_stage and "--skip-kmod" in efa_stage
    assert re.search(r"ARG EFA_INSTALLER_VERSION=\d+\.\d+\.\d+", efa_stage)
    # The installer's Ubuntu packages put the plugin under lib/x86_64-linux-gnu; the build fails
    # if NCCL's EFA plugin is not where LD_LIBRARY_PATH points.
    assert "/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu" in efa_stage
    assert "libnccl-net" in efa_stage
    assert f"USER {TRAINER_UID}" in efa_stage.strip().splitlines()[-1]


# --- SSE-KMS, FSx permissions, partitions -----------------------------------------------------


def test_job_roles_may_use_the_bucket_key_when_the_bucket_is_sse_kms(prod_plan, dev_plan):
    key = prod_plan.one("aws:kms/key:Key", "training-bucket-sse")
    key_arn = next(
        r.inputs["rules"][0]["applyServerSideEncryptionByDefault"]["kmsMasterKeyId"]
        for r in prod_plan.of_type(
            "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration"
        )
    )
    job_policies = [
        json.loads(p.inputs["policy"])
        for p in prod_plan.of_type("aws:iam/rolePolicy:RolePolicy")
        if p.name.startswith("job-")
    ]
    assert job_policies
    # Named by its alias, known in a preview (the key's ARN is not): the policy pack can read it.
    alias = prod_plan.one("aws:kms/alias:Alias", "training-bucket-sse").inputs
    assert alias["name"] == "alias/tp-prod-training-bucket"
    assert alias["targetKeyId"] == key_arn.rsplit("/", 1)[1]
    for policy in job_policies:
        (grant,) = [s for s in policy["Statement"] if s["Sid"] == "BucketKey"]
        assert grant["Action"] == ["kms:GenerateDataKey", "kms:Decrypt"]
        assert grant["Resource"] == "arn:aws:kms:us-west-2:123456789012:key/*"
        assert grant["Condition"] == {
            "ForAnyValue:StringEquals": {"kms:ResourceAliases": alias["name"]}
        }
    for job in [r for t in JOBS for r in prod_plan.of_type(t)]:
        assert alias and prod_plan.one("aws:kms/alias:Alias", "training-bucket-sse").urn in (
            job.dependencies
        )
    # FSx's data repository association reads and writes S3 as its service-linked role.
    key_policy = json.loads(key.inputs["policy"])
    (fsx,) = [s for s in key_policy["Statement"] if s["Sid"] == "FsxDataRepositoryThroughS3"]
    bucket_arn = prod_plan.one("aws:s3/bucketPolicy:BucketPolicy").inputs["policy"]
    bucket_arn = json.loads(bucket_arn)["Statement"][0]["Resource"][0]
    assert fsx["Condition"] == {
        "StringEquals": {
            "kms:CallerAccount": "123456789012",
            "kms:ViaService": "s3.us-west-2.amazonaws.com",
            "kms:EncryptionContext:aws:s3:arn": bucket_arn,
        },
        "StringLike": {"aws:userid": "*:FSx"},
    }
    for policy in dev_plan.of_type("aws:iam/rolePolicy:RolePolicy"):
        assert "kms:" not in policy.inputs["policy"] or not policy.name.startswith("job-")


def test_fsx_checkpoints_are_writable_by_the_trainer_user(prod_plan):
    (job,) = [
        r
        for t in JOBS
        for r in prod_plan.of_type(t)
        if '"--checkpoint-dir", "/fsx/' in json.dumps(r.inputs["spec"])
    ]
    for template in pod_templates(job.inputs):
        if "initContainers" not in template["spec"]:
            continue
        (init,) = template["spec"]["initContainers"]
        directory = f"/fsx/checkpoints/{job.inputs['metadata']['name']}"
        assert init["command"][-1] == (
            f'mkdir -p "{directory}" && chown {TRAINER_UID}:{TRAINER_UID} "{directory}"'
        )
        assert init["securityContext"]["capabilities"] == {
            "drop": ["ALL"],
            "add": ["CHOWN", "DAC_OVERRIDE"],
        }
        break
    else:
        pytest.fail("no init container prepares the FSx checkpoint folder")
    assert re.search(rf"useradd .*--uid {TRAINER_UID}", (ROOT / "trainer/Dockerfile").read_text())


def test_every_arn_is_built_from_the_partition():
    values = stack_values("prod")
    config = parse_stack_config(values, "Pulumi.prod.yaml")
    plan = run_offline(lambda: build_platform(config), "prod", values, partition="aws-cn")
    text = json.dumps([r.inputs for r in plan.resources])
    # Admin and DevServer user principals come from stack config as written; everything the
    # program builds follows.
    for principal in ("role/platform-admins", "role/dev-carol"):
        text = text.replace(f"arn:aws:iam::123456789012:{principal}", "")
    assert "arn:aws-cn:" in text and "arn:aws:" not in text


# --- CI fails when the plan fails -------------------------------------------------------------


def test_every_workflow_step_with_a_pipe_fails_when_the_pipeline_does():
    for workflow in (ROOT / ".github" / "workflows").glob("*.yml"):
        document = yaml.safe_load(workflow.read_text())
        default_shell = (document.get("defaults") or {}).get("run", {}).get("shell")
        for job in document["jobs"].values():
            job_shell = (job.get("defaults") or {}).get("run", {}).get("shell", default_shell)
            for step in job["steps"]:
                run = step.get("run", "")
                if re.search(r"[^|]\|[^|]", run):
                    shell = step.get("shell", job_shell)
                    # GitHub runs `shell: bash` as `bash -eo pipefail`; its default does not.
                    assert shell == "bash" or "set -o pipefail" in run, (workflow.name, run)
