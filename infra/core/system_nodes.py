"""Where the platform's controllers run: the managed system node group, tainted for them alone.

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
