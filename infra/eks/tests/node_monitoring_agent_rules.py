"""The EKS node monitoring agent's rules that the tests check the platform against, written down
from its source (aws/eks-node-monitoring-agent, tag v1.7.0, commit
c399089dec78cb245306ca2a5f9806b7c32ca093; files named at each rule): what the add-on's
configuration may say, and where its DCGM host engine runs and listens.
"""

# charts/configuration.schema.json: the configuration values CreateAddon accepts, the parts the
# platform sets, as a JSON schema (draft-07, as upstream's). Every object there is closed
# ("additionalProperties": false); `tolerations` is an array of objects.
_TOLERATIONS = {"type": "array", "items": {"type": "object"}}
CONFIGURATION_SCHEMA = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "global": {"type": "object"},
        "nodeAgent": {"type": "object"},
        "extraObjects": {"type": "array"},
        "dcgmAgent": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "affinity": {"type": "object"},
                "podAnnotations": {"type": "object"},
                "podLabels": {"type": "object"},
                "nodeSelector": {"type": "object"},
                "priorityClassName": {"type": "string"},
                "resources": {"type": "object"},
                "resizePolicy": {"type": "array"},
                "tolerations": _TOLERATIONS,
            },
        },
    },
}

# charts/eks-node-monitoring-agent/values.yaml, dcgmAgent: the dcgm-server DaemonSet's defaults.
# It tolerates no taint, and its required node affinity is one term: an instance type of this
# list, not these compute types, amd64.
DCGM_SERVER_TOLERATIONS: list[dict] = []
DCGM_SERVER_INSTANCE_TYPES = frozenset(
    """
    g3.16xlarge g3.4xlarge g3.8xlarge g3s.xlarge g4dn.12xlarge g4dn.16xlarge g4dn.2xlarge
    g4dn.4xlarge g4dn.8xlarge g4dn.metal g4dn.xlarge g5.12xlarge g5.16xlarge g5.24xlarge
    g5.2xlarge g5.48xlarge g5.4xlarge g5.8xlarge g5.xlarge g5g.16xlarge g5g.2xlarge g5g.4xlarge
    g5g.8xlarge g5g.metal g5g.xlarge g6.12xlarge g6.16xlarge g6.24xlarge g6.2xlarge g6.48xlarge
    g6.4xlarge g6.8xlarge g6.xlarge g6e.12xlarge g6e.16xlarge g6e.24xlarge g6e.2xlarge
    g6e.48xlarge g6e.4xlarge g6e.8xlarge g6e.xlarge g6f.2xlarge g6f.4xlarge g6f.large g6f.xlarge
    g7.12xlarge g7.24xlarge g7.2xlarge g7.48xlarge g7.4xlarge g7.8xlarge g7e.12xlarge
    g7e.24xlarge g7e.2xlarge g7e.48xlarge g7e.4xlarge g7e.8xlarge gr6.4xlarge gr6.8xlarge
    gr6f.4xlarge p2.16xlarge p2.8xlarge p2.xlarge p3.16xlarge p3.2xlarge p3.8xlarge
    p3dn.24xlarge p4d.24xlarge p4de.24xlarge p5.48xlarge p5.4xlarge p5e.48xlarge p5en.48xlarge
    p6-b200.48xlarge p6-b300.48xlarge p6e-gb200.36xlarge p6e-gb300.36xlarge
    """.split()
)
DCGM_SERVER_EXCLUDED_COMPUTE_TYPES = ("fargate", "auto", "hybrid")

# charts/eks-node-monitoring-agent/templates/dcgm-daemonset.yaml: the container runs
# `nv-hostengine -n -b ALL` and publishes containerPort 5555 as hostPort 5555.
DCGM_HOST_ENGINE_HOST_PORT = 5555
