"""The platform's node vocabulary: the labels, taints and tolerations that say what a node is
(a system node, a pool's, a hybrid machine, a GPU node), shared by every integration that
places pods or makes nodes.

Where the platform's controllers run: the managed system node group, tainted for them alone.

Controllers (Karpenter, Kueue, the job operators, the CSI controllers, CoreDNS) must outlive the
nodes Karpenter launches and must never land on them; nothing else may land on the system nodes.
CriticalAddonsOnly is the taint the Karpenter chart, CoreDNS and the EBS/EFS/FSx CSI controllers
already tolerate by default.
"""

SYSTEM_NODE_LABEL = {"training-platform/node-role": "system"}
SYSTEM_TAINT_KEY = "CriticalAddonsOnly"
SYSTEM_TOLERATION = {"key": SYSTEM_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}
# Helm values that put a chart's controller on the system nodes.
SYSTEM_PLACEMENT = {"nodeSelector": SYSTEM_NODE_LABEL, "tolerations": [SYSTEM_TOLERATION]}

# The label a pod selects its pool by. No kubelet may set, change or remove a label of the
# node-restriction.kubernetes.io domain on its own Node (the NodeRestriction admission plugin,
# kubernetes plugin/pkg/admission/noderestriction/admission.go, getForbiddenLabels), so a machine
# joining as a hybrid node cannot pass for a pool: Karpenter sets it through the API
# (infra/karpenter/node_pools.py), the gateway on the machines' nodes
# (infra/hybrid/gateway_sync.py), never their kubelets.
POOL_LABEL = "training-platform.node-restriction.kubernetes.io/pool"
# Which hybrid machine a node is: the gateway sets it with POOL_LABEL=hybrid on the node it has
# matched to the machine by its credentials (infra/hybrid/gateway_sync.py), and pods of a job or
# flavor select the machines they may use by it (infra/hybrid/placement.py).
MACHINE_LABEL = "training-platform.node-restriction.kubernetes.io/machine"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
# What the DaemonSets that serve GPU nodes (device plugins, DCGM exporter) tolerate.
GPU_TOLERATION = {"key": GPU_TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}
# The NVIDIA device plugin chart schedules itself onto nodes carrying this label.
GPU_NODE_LABELS = {"nvidia.com/gpu.present": "true"}
# The EFA device plugin runs on nodes carrying this label.
EFA_NODE_LABELS = {"training-platform/efa": "true"}
# The label EKS gives what is not an EC2 node of the cluster: `hybrid` on a hybrid node (nodeadm
# sets it; infra/hybrid/admission.py holds it there), `fargate`, `auto`. EKS's add-ons keep
# their node agents off such nodes by it (their charts' affinity).
COMPUTE_TYPE = "eks.amazonaws.com/compute-type"
