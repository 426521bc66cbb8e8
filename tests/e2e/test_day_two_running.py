"""What edits do to running work: the nodes that drift, the jobs that restart or keep running,
and an upgrade to each supported Kubernetes version, in the order EKS requires."""

import copy
import json

import pytest

from deploy.day_two import consequences
from deploy.program import build_platform
from infra.core.offline import run_offline
from infra.core.versions import KUBERNETES_VERSIONS
from infra.integrations import plan_steps
from infra.stack.loading import parse_stack_config
from tests.config_edits import PREBUILT_IMAGE
from tests.plugin import plan_of, stack_values

STACK = "prod"
EKS = "eks:index:Cluster"
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
ADDON = "aws:eks/addon:Addon"


def planned(**sections):
    values = stack_values(STACK, **sections)
    config = parse_stack_config(values, f"Pulumi.{STACK}.yaml")
    return config, values


@pytest.fixture(scope="module")
def base():
    return plan_of(STACK)


def effects_of(base, **sections):
    config, values = planned(**sections)
    after = run_offline(lambda: build_platform(config), STACK, values, None, base.outputs)
    outputs = after.outputs
    found = consequences(
        plan_steps(base, after), config, STACK, outputs.get("jobs"), outputs.get("runtimes")
    )
    return found, after


def pools_with(name: str, **changes) -> list[dict]:
    return [
        {**p, **changes} if p["name"] == name else p
        for p in stack_values(STACK)["training-platform:nodePools"]
    ]


def test_an_ami_bump_drifts_every_pool_and_moves_no_running_job(base):
    effects, _ = effects_of(base, karpenter={"amiAlias": "al2023@v20261101"})
    assert {line.split(":")[0] for line in effects.drifts} == {"gpu-small", "gpu-large", "cpu"}
    assert all("a new AMI" in line for line in effects.drifts)
    assert not effects.losses and not effects.refusals
    kept = [r for r in effects.restarts if "keeps its gpu-large nodes while it runs" in r]
    assert len(kept) == 2 and all("deploy.roll --stack prod --pool gpu-large" in r for r in kept)
    assert not [r for r in effects.restarts if "restarts (" in r]


def test_a_shorter_expire_after_drifts_its_pool(base):
    effects, _ = effects_of(base, nodePools=pools_with("gpu-large", expireAfter="168h"))
    assert effects.drifts == ["gpu-large: every node (template spec.expireAfter); up to 16 nodes"]


def test_an_instance_type_removed_drifts_only_its_nodes(base):
    effects, _ = effects_of(base, nodePools=pools_with("cpu", instanceTypes=["m6i.2xlarge"]))
    (line,) = effects.drifts
    assert "node.kubernetes.io/instance-type m6i.4xlarge" in line and "(no longer allowed)" in line


def test_a_new_trainer_image_waits_for_the_jobs_and_runtimes_revisions(base):
    effects, after = effects_of(base, image={"uri": PREBUILT_IMAGE})
    held = [r for r in effects.restarts if "keeps revision 1" in r]
    assert all("changes to its image wait for" in r for r in held)
    assert sorted(r.split(" keeps")[0] for r in held) == [
        "job gpt-large",
        "job gpt-large-mpi",
        "runtime torch-cpu",
        "runtime torch-gpu-large",
        "runtime torch-gpu-small",
    ]
    # Nothing of theirs changes: their manifests are the ones they run.
    jobs = [
        r
        for r in after.resources
        if r.type.startswith(("kubernetes:kubeflow.org/", "kubernetes:trainer.kubeflow.org/"))
    ]
    kept = {r.urn: r.inputs for r in base.resources if r.urn in {j.urn for j in jobs}}
    assert len(jobs) == 5 and all(kept[j.urn] == j.inputs for j in jobs)


def test_a_revision_bump_restarts_its_job_once_on_what_the_stack_says(base):
    jobs = [
        {**j, "revision": 2} if j["name"] == "gpt-large" else j
        for j in stack_values(STACK)["training-platform:jobs"]
    ]
    effects, after = effects_of(base, image={"uri": PREBUILT_IMAGE}, jobs=jobs)
    (restart,) = [r for r in effects.restarts if r.startswith("job gpt-large restarts")]
    assert "Worker containers image" in restart and "initContainers image" in restart
    (job,) = [r for r in after.resources if r.name == "job-gpt-large" and "PyTorchJob" in r.type]
    template = job.inputs["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    assert template["spec"]["containers"][0]["image"] == PREBUILT_IMAGE
    assert any("gpt-large-mpi keeps revision 1" in r for r in effects.restarts)


def test_an_args_edit_is_held_back_until_the_revision_moves(base):
    jobs = stack_values(STACK)["training-platform:jobs"]
    edited = [{**j, "args": [*j["args"], "--seed", "3"]} for j in jobs]
    effects, _ = effects_of(base, jobs=edited)
    assert sum("changes to its command and arguments wait" in r for r in effects.restarts) == 2
    bumped = [{**j, "revision": 2} for j in edited]
    effects, _ = effects_of(base, jobs=bumped)
    restarts = [r for r in effects.restarts if " restarts (" in r]
    assert len(restarts) == 2 and all("containers command" in r for r in restarts)


@pytest.mark.parametrize("version", sorted(KUBERNETES_VERSIONS))
def test_each_supported_version_plans_with_its_add_ons_and_the_node_group_follows(version):
    plan = plan_of(STACK, cluster={"kubernetesVersion": version})
    cluster = plan.one(EKS)
    group = plan.one(NODE_GROUP)
    pins = KUBERNETES_VERSIONS[version].addons
    assert cluster.inputs["version"] == version and group.inputs["version"] == version
    assert cluster.inputs["kubeProxyAddonOptions"]["version"] == pins["kube-proxy"]
    addons = {a.inputs["addonName"]: a for a in plan.of_type("aws:eks/addon:Addon")}
    for name, addon in addons.items():
        assert addon.inputs["addonVersion"] == pins[name], name
        # EKS upgrades add-ons after the control plane: each waits for the cluster.
        assert cluster.urn in addon.dependencies, name
    # The node group is upgraded after the control plane (EKS refuses nodes ahead of it).
    assert cluster.urn in group.dependencies
    assert cluster.inputs["upgradePolicy"] == {"supportType": "EXTENDED"}


def minor(version: str) -> int:
    return int(version.split(".")[1])


# Every supported version and the next: 1.34 -> 1.35 -> 1.36 -> 1.37, one minor at a time.
STEPS = [
    (old, new)
    for old in KUBERNETES_VERSIONS
    for new in KUBERNETES_VERSIONS
    if minor(new) == minor(old) + 1
]


@pytest.mark.parametrize(("old_version", "new_version"), sorted(STEPS))
def test_an_upgrade_rolls_every_pool_and_the_system_nodes_without_losing_data(
    old_version, new_version
):
    old = plan_of(STACK, cluster={"kubernetesVersion": old_version})
    effects, after = effects_of(old, cluster={"kubernetesVersion": new_version})
    assert not effects.losses and not effects.refusals
    assert all(f"AMI for Kubernetes {old_version} -> {new_version}" in d for d in effects.drifts)
    assert len(effects.drifts) == 3
    notes = " ".join(effects.notes)
    assert f"control plane upgrades {old_version} -> {new_version} first" in notes
    assert "node group cluster-system: EKS replaces its nodes one at a time" in notes
    # The system node group follows the control plane to the new minor, with the new add-ons.
    assert after.one(NODE_GROUP).inputs["version"] == new_version
    pins = KUBERNETES_VERSIONS[new_version].addons
    addons = {a.inputs["addonName"]: a.inputs["addonVersion"] for a in after.of_type(ADDON)}
    assert addons and all(build == pins[name] for name, build in addons.items())
    assert after.one(EKS).inputs["kubeProxyAddonOptions"]["version"] == pins["kube-proxy"]


def test_the_upgrades_span_every_supported_version_and_skipping_one_is_refused():
    assert sorted(STEPS) == [("1.34", "1.35"), ("1.35", "1.36"), ("1.36", "1.37")]
    old = plan_of(STACK, cluster={"kubernetesVersion": "1.35"})
    effects, _ = effects_of(old, cluster={"kubernetesVersion": "1.37"})
    assert effects.refusals == [
        "kubernetes-version: cluster.kubernetesVersion 1.35 -> 1.37: EKS upgrades one minor "
        "version at a time; allowed: 1.35, or 1.36"
    ]


def test_a_kubernetes_downgrade_is_refused_as_eks_refuses_it(base):
    effects, _ = effects_of(base, cluster={"kubernetesVersion": "1.34"})
    assert effects.refusals == [
        "kubernetes-version: cluster.kubernetesVersion 1.35 -> 1.34: EKS never downgrades a "
        "control plane; allowed: 1.35, or 1.36"
    ]


def test_a_real_previews_cluster_resource_drifts_the_pools_and_skips_no_version():
    """A real preview names the control plane aws:eks/cluster:Cluster (pulumi-eks's child), not
    the component the offline plan records: the same rules hold for it."""
    old = plan_of(STACK, cluster={"kubernetesVersion": "1.34"})
    config, values = planned()
    new = run_offline(lambda: build_platform(config), STACK, values, None, old.outputs)
    steps = plan_steps(old, new)
    for step in steps:
        if step.type == EKS:
            step.type = "aws:eks/cluster:Cluster"
    effects = consequences(steps, config, STACK)
    assert len(effects.drifts) == 3 and "control plane upgrades 1.34 -> 1.35" in effects.notes[0]
    # Two minor versions at once: EKS refuses it, so does the plan.
    (cluster,) = [s for s in steps if s.type == "aws:eks/cluster:Cluster"]
    cluster.old.inputs["version"] = "1.33"
    assert consequences(steps, config, STACK).refusals == [
        "kubernetes-version: cluster.kubernetesVersion 1.33 -> 1.35: EKS upgrades one minor "
        "version at a time; allowed: 1.33, or 1.34"
    ]


def test_losing_fsx_names_the_running_work_on_it(base):
    fsx = stack_values(STACK)["training-platform:storage"]["fsx"]
    ack = [{"holder": "storage.fsx", "reason": "shrink"}]
    effects, _ = effects_of(
        base, storage={"fsx": {**fsx, "storageCapacityGib": 2400}}, acknowledgeDataLoss=ack
    )
    assert not effects.refusals
    (line,) = [r for r in effects.restarts if "FSx for Lustre" in r]
    assert line.startswith("every pod that mounts FSx for Lustre loses it")
    assert "gpt-large checkpoint there and resume from what reached the bucket" in line


def test_a_flavor_edit_restarts_its_servers_and_a_removed_one_stops_them(base):
    flavors = stack_values(STACK)["training-platform:devServers"]["flavors"]
    smaller = [{**f, "cpu": 6} if f["name"] == "gpu-1" else f for f in flavors]
    effects, _ = effects_of(base, devServers={"flavors": smaller})
    assert effects.restarts == [
        "DevServer flavor gpu-1 changes (resources): every server of that flavor restarts on new "
        "pods (homes stay; what runs in them ends)"
    ]
    effects, _ = effects_of(base, devServers={"flavors": flavors[:1]})
    assert effects.restarts == [
        "DevServer flavor a100-8 is deleted: the servers of that flavor stop (homes stay) until "
        "their owners pick another"
    ]


def test_fewer_zones_say_the_subnets_nodes_must_go_first(base):
    effects, two_zones = effects_of(base, network={"azCount": 2})
    deleted = [n for n in effects.notes if n.startswith("subnet ")]
    assert {n.split(" ")[1] for n in deleted} >= {"network-private-2", "network-public-2"}
    assert all("AWS refuses while a node" in n for n in deleted)
    assert (
        "eks-network: the VPC leaves us-west-2c (network.azCount): EKS takes control-plane "
        "subnets only in the AZs the cluster was made in" in effects.refusals[0]
    )
    # gpu-1's pool spans the zones, so some of its homes may be in the one that goes; a100-8's
    # pool is held to us-west-2a, which stays.
    homes = [r for r in effects.restarts if r.startswith("DevServer flavor ")]
    assert [h.split(":")[0] for h in homes] == ["DevServer flavor gpu-1"]
    assert "homes made in us-west-2c stay there" in homes[0] and "on gpu-small" in homes[0]
    # The other way, a zone added: EKS refuses control-plane subnets outside the first AZs.
    config, _ = planned()
    added = consequences(plan_steps(two_zones, base), config, STACK).refusals
    assert [r.split(":")[1] for r in added if r.startswith("eks-network")] == [
        " the VPC adds us-west-2c (network.azCount)"
    ]


def test_a_pool_moved_to_another_zone_names_the_homes_it_strands(base):
    """red before: the plan named the pool's drift, not the servers that cannot start again."""
    effects, _ = effects_of(base, nodePools=pools_with("gpu-large", availabilityZone="us-west-2b"))
    homes = [r for r in effects.restarts if r.startswith("DevServer flavor ")]
    assert homes == [
        "DevServer flavor a100-8: homes made in us-west-2a stay there (an EBS volume attaches in "
        "its own AZ only), so their servers cannot start on gpu-large until each home is moved "
        "(snapshot it, restore it in the pool's zone: day-two.md, Moving a pool to another zone)"
    ]


def test_one_nat_gateway_instead_of_one_per_zone_says_what_connections_break(base):
    effects, _ = effects_of(base, network={"natGateways": "single"})
    nats = sorted(n.split(" ")[2] for n in effects.notes if n.startswith("NAT gateway "))
    assert nats == ["network-1", "network-2"]
    assert all("connections of the nodes behind it" in n for n in effects.notes if "NAT" in n)


def test_a_job_moved_to_another_queue_starts_again_from_step_0(base):
    jobs = stack_values(STACK)["training-platform:jobs"]
    moved = [{**j, "queue": "team-a"} if j["name"] == "gpt-large-mpi" else j for j in jobs]
    effects, _ = effects_of(base, jobs=moved)
    (line,) = [r for r in effects.restarts if r.startswith("job gpt-large-mpi")]
    assert (
        "it starts again from step 0 at s3://" in line
        and "/checkpoints/team-a/gpt-large-mpi in team-a: its checkpoints stay at" in line
        and "/checkpoints/research-jobs/gpt-large-mpi in research-jobs" in line
    )


def test_a_held_revision_whose_claims_go_is_refused_until_it_moves(base):
    """FSx turned off deletes the teams' FSx claims, which the jobs' kept revisions and the
    runtimes' mount (every pod of a team mounts them): their pods could never start again, and
    the deletion waits for them."""
    storage = stack_values(STACK)["training-platform:storage"]
    jobs = [
        {**j, "checkpoint": "s3"} if j.get("checkpoint") == "fsx" else j
        for j in stack_values(STACK)["training-platform:jobs"]
    ]
    sections = {
        "storage": {**storage, "fsx": {"enabled": False}},
        "acknowledgeDataLoss": [{"holder": "storage.fsx", "reason": "off"}],
    }
    effects, _ = effects_of(base, jobs=jobs, **sections)
    held = sorted(r.split(",")[0] for r in effects.refusals if r.startswith("held-revision:"))
    assert held == [
        "held-revision: job gpt-large keeps revision 1",
        "held-revision: job gpt-large-mpi keeps revision 1",
        "held-revision: runtime torch-cpu keeps revision 1",
        "held-revision: runtime torch-gpu-large keeps revision 1",
        "held-revision: runtime torch-gpu-small keeps revision 1",
    ]
    (job,) = [r for r in effects.refusals if "job gpt-large " in r]
    assert "mount fsx-checkpoints, fsx-datasets, which this update deletes" in job
    assert "move jobs[gpt-large].revision to 2 in this update" in job
    moved = [{**j, "revision": 2} for j in jobs]
    effects, _ = effects_of(base, jobs=moved, runtimes={"revision": 2}, **sections)
    assert not [r for r in effects.refusals if r.startswith("held-revision:")]


def test_a_team_removed_takes_its_claims_with_no_held_revision_refused(base):
    """Its namespace goes, and what ran there with it: the runtimes, held at their revision by a
    new image, mount those claims there only through TrainJobs that go too."""
    teams = stack_values(STACK)["training-platform:queues"]["teams"]
    kept = [t for t in teams if t["name"] != "team-a"]
    ack = [
        {"holder": "queues.teams[team-a]", "reason": "gone"},
        {"holder": "images", "reason": "a prebuilt image"},
    ]
    effects, _ = effects_of(
        base, queues={"teams": kept}, image={"uri": PREBUILT_IMAGE}, acknowledgeDataLoss=ack
    )
    assert [r for r in effects.restarts if r.startswith("runtime torch-cpu keeps revision 1")]
    assert not [r for r in effects.refusals if r.startswith("held-revision:")]


def test_a_job_whose_kind_changes_is_refused_because_both_would_run(base):
    """gpt-large as a fixed-size job without `kind`: a TrainJob, a new object of another type
    beside the running PyTorchJob, which Pulumi deletes only at the update's end."""
    jobs = [
        {k: v for k, v in j.items() if k not in ("kind", "maxRestarts")}
        | {"minNodes": 4, "maxNodes": 4, "checkpoint": "s3"}
        if j["name"] == "gpt-large"
        else j
        for j in stack_values(STACK)["training-platform:jobs"]
    ]
    effects, _ = effects_of(base, jobs=jobs)
    (refusal,) = [r for r in effects.refusals if r.startswith("job-kind:")]
    assert "job gpt-large in team-b changes kind PyTorchJob -> TrainJob" in refusal
    assert "remove the job in one update and add it back in the next" in refusal


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_no_pod_of_the_stack_uses_a_gitrepo_volume(stack):
    """Kubernetes 1.36 locks the gitRepo volume plugin off (KEP-5040, kubernetes/kubernetes#136400):
    a pod with one would never start on the supported versions."""
    found = [r.name for r in plan_of(stack).resources if '"gitRepo"' in json.dumps(r.inputs)]
    assert found == []


def test_a_stack_from_before_moves_its_control_plane_into_subnets_of_its_own(base):
    """A stack deployed when the control plane took the private and public subnets: the next
    `pulumi up` updates the cluster in place (its subnets are not a replacing input), and the
    plan says what EKS does and requires."""
    old = copy.deepcopy(base)
    cluster = old.one(EKS).inputs
    control_plane = cluster.pop("subnetIds")
    cluster["privateSubnetIds"] = ["subnet-private-a", "subnet-private-b", "subnet-private-c"]
    cluster["publicSubnetIds"] = ["subnet-public-a", "subnet-public-b", "subnet-public-c"]
    config, _ = planned()
    steps = plan_steps(old, base)
    (step,) = [s for s in steps if s.type == EKS]
    assert step.op == "update" and {"subnetIds", "privateSubnetIds"} <= set(step.reasons)
    assert len(control_plane) == 3
    found = consequences(steps, config, STACK, None, None)
    assert not found.refusals and not found.losses
    assert (
        "cluster cluster: EKS moves the control plane's network interfaces into its own subnets"
        in " ".join(found.notes)
    )


def test_a_larger_file_system_resizes_its_volumes_not_the_claims_the_api_server_would_refuse(
    base,
):
    """The API server refuses to resize a claim bound to a static volume: the FSx claims keep
    their size (ignoreChanges, which the offline plan applies as the engine does), their volumes
    follow the file system."""
    storage = stack_values(STACK)["training-platform:storage"]
    effects, after = effects_of(
        base, storage={**storage, "fsx": {**storage["fsx"], "storageCapacityGib": 7200}}
    )
    steps = plan_steps(base, after)
    claims = [s for s in steps if s.type == "kubernetes:core/v1:PersistentVolumeClaim"]
    volumes = [s for s in steps if s.type == "kubernetes:core/v1:PersistentVolume"]
    assert not claims and volumes
    assert all(s.op == "update" and s.reasons == ["spec.capacity.storage"] for s in volumes)
    assert not effects.refusals
    claim = next(
        r for r in after.of_type("kubernetes:core/v1:PersistentVolumeClaim") if "fsx" in r.name
    )
    assert claim.ignore_changes == ["spec.resources"]


def test_a_job_whose_checkpoint_store_moves_starts_again_from_step_0(base):
    """fsx -> s3 with the revision bumped: an update Kueue restarts the job for, whose trainer
    finds no checkpoint in its new folder (red before: "it resumes from its newest checkpoint")."""
    jobs = stack_values(STACK)["training-platform:jobs"]
    moved = [
        {**j, "checkpoint": "s3", "revision": 2} if j["name"] == "gpt-large" else j for j in jobs
    ]
    effects, _ = effects_of(base, jobs=moved)
    (line,) = [r for r in effects.restarts if r.startswith("job gpt-large ")]
    assert "Kueue suspends it, queues it again and it starts again from step 0 at s3://" in line
    assert "/checkpoints/team-b/gpt-large in team-b: its checkpoints stay at /fsx/" in line


def test_a_larger_system_node_disk_names_the_rolling_replacement_of_every_system_node(base):
    """red before: a new launch template version printed only cost lines."""
    cluster = stack_values(STACK)["training-platform:cluster"]
    group = {**cluster["systemNodeGroup"], "diskSizeGib": 100}
    effects, _ = effects_of(base, cluster={**cluster, "systemNodeGroup": group})
    (line,) = [r for r in effects.restarts if r.startswith("launch template ")]
    assert "changes (blockDeviceMappings): a new version" in line
    assert "EKS replaces every system node, one at a time" in line


def test_a_reservation_swapped_drifts_the_nodes_in_the_old_one():
    """Karpenter drifts a node whose reservation its EC2NodeClass no longer selects, although the
    selector terms are outside the class's hash (red before: nothing printed)."""

    def holding(reservation: str):
        pool = {
            "capacityTypes": ["reserved", "on-demand"],
            "capacityReservations": [
                {"id": reservation, "instanceType": "p4d.24xlarge", "instanceCount": 4}
            ],
        }
        return planned(nodePools=pools_with("gpu-large", **pool))

    config, values = holding("cr-0aaaaaaaaaaaaaaaa")
    before = run_offline(lambda: build_platform(config), STACK, values)
    config, values = holding("cr-0bbbbbbbbbbbbbbbb")
    after = run_offline(lambda: build_platform(config), STACK, values, None, before.outputs)
    drifts = consequences(plan_steps(before, after), config, STACK).drifts
    assert [d for d in drifts if d.startswith("gpu-large:")] == [
        "gpu-large: the nodes in capacity reservation cr-0aaaaaaaaaaaaaaaa (no longer selected: "
        "karpenter-provider-aws pkg/cloudprovider/drift.go isCapacityReservationDrifted)"
    ]


def test_a_new_vpc_range_is_refused_as_eks_and_efs_cannot_follow(base):
    """red before: the VPC and subnets were listed as replaced, "no data lost"."""
    effects, _ = effects_of(base, network={"cidr": "10.64.0.0/16"})
    assert [r for r in effects.refusals if r.startswith("eks-network")] == [
        "eks-network: the VPC is replaced (cidrBlock): EKS keeps the cluster in the VPC it was "
        "made in, and EFS its mount targets, so the update would fail half applied; allowed: "
        "the network as it is, or a new stack for the new network (a new cluster and file "
        "systems; data moved by hand)"
    ]
