"""HybridHomes: DevServer homes on the hybrid machines' own disks.

Only EC2 instances attach EBS volumes, and the EBS, EFS and FSx CSI node agents avoid hybrid
nodes, so a DevServer on the machines keeps its home in a directory of the machine it runs on.
The local-path provisioner (rancher/local-path-provisioner, pinned in infra/core/versions.py,
patched by the overlay deploy/manifests/local-path-provisioner) makes one per claim of the
StorageClass below, when the claim's first pod has been scheduled: the PersistentVolume it records
pins every later pod of that claim to that machine (required node affinity on
kubernetes.io/hostname). A home on a machine is used only there, and a server whose machine is off
cannot start until it is back.

What upstream does, read at the pinned tag (provisioner.go, util.go, main.go):
- the controller only calls the API server; a helper pod per create and delete does the disk
  work: `mkdir -m 0777` or `rm -rf` of the home's directory through a hostPath volume of its
  parent (/opt/local-path-provisioner), in the provisioner's own namespace (local-path-storage),
  pinned by spec.nodeName to the home's node. That namespace needs Pod Security privileged
  (hostPath); users' namespaces never hold those pods and stay restricted;
- it provisions only for a selected node (volumeBindingMode WaitForFirstConsumer); without one
  it fails the claim;
- the volume is a `local` PersistentVolume when the class says so (annotation
  defaultVolumeType), else a hostPath one of type DirectoryOrCreate, which would quietly mount
  a new empty directory if the home's were gone; a local volume's path must exist to mount;
- the PersistentVolume takes the class's reclaimPolicy, and its directory is removed when the
  claim is deleted only under Delete. Homes outlive their servers the way gp3 ones do: the
  StatefulSet retains its claims (devservers/render.py), and deleting a claim (`devctl delete
  --delete-home`, `kubectl delete pvc`) means deleting the home. Retain would leave the
  directory and a Released volume behind that no claim, quota or `devctl list --homes` shows;
- it does not enforce a size: a home takes what is written into it, up to the machine's disk.
"""

from pathlib import Path

import pulumi
import pulumi_kubernetes as k8s

from infra.core.context import ClusterContext
from infra.core.network_policies import platform_namespace
from infra.core.paths import provider_path

STORAGE_CLASS = "hybrid-local"
# main.go DefaultProvisionerName: the provisioner name the StorageClass names.
PROVISIONER = "rancher.io/local-path"
# main.go DefaultNamespace, deploy/local-path-storage.yaml: where it and its helper pods run.
NAMESPACE = "local-path-storage"
# The overlay's folder in the folder the program hands over.
OVERLAY = "local-path-provisioner"


class HybridHomes(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        cluster: ClusterContext,
        overlays: Path,  # the folder holding the OVERLAY
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("training-platform:infra:HybridHomes", name, None, opts)
        install = k8s.kustomize.v2.Directory(
            "local-path-provisioner",
            directory=provider_path(overlays / OVERLAY),
            opts=cluster.in_cluster(self, *cluster.controller_prerequisites),
        )
        k8s.storage.v1.StorageClass(
            STORAGE_CLASS,
            metadata={"name": STORAGE_CLASS, "annotations": {"defaultVolumeType": "local"}},
            provisioner=PROVISIONER,
            volume_binding_mode="WaitForFirstConsumer",
            reclaim_policy="Delete",
            # A directory has no size to grow.
            allow_volume_expansion=False,
            opts=cluster.in_cluster(self, install),
        )
        # The provisioner and its helper pods only call the API server.
        platform_namespace(name, NAMESPACE, cluster, self, [install])
        self.register_outputs({"storageClass": STORAGE_CLASS})
