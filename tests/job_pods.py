"""The pods Kubeflow Trainer v2.3.0 and JobSet v0.12.0 make of a TrainJob on a
ClusterTrainingRuntime, for the local API's kubelet to run: upstream's rules written down from
source (kubeflow/trainer tag v2.3.0, kubernetes-sigs/jobset tag v0.12.0, Kubernetes' Job
controller), so a test runs the containers a cluster would run, environment included.

- The Trainer builds the JobSet from the runtime's template (pkg/runtime/framework/plugins/
  jobset/builder.go, Trainer l.113-160): in the replicated job labelled as the trainer's
  ancestor, the container named `node` takes spec.trainer's image, command and args where the
  TrainJob sets them (each replaces the runtime's), and spec.trainer.env upserted over its env.
  runtimePatches add their pod template metadata and spec fields (here: labels,
  serviceAccountName).
- The torch plugin (plugins/torch/torch.go EnforceMLPolicy l.110-): the trainer job's count is
  numNodes; PET_NNODES = that count, PET_NPROC_PER_NODE = numProcPerNode (else "auto", the CPU
  request on a pod without GPUs), PET_NODE_RANK from the pod's annotation
  batch.kubernetes.io/job-completion-index (constants.go JobCompletionIndexFieldPath),
  PET_MASTER_ADDR = <trainjob>-node-0-0.<trainjob>, PET_MASTER_PORT = 29500
  (ContainerTrainerPort), all upserted over the container's env.
- JobSet (pkg/controllers/jobset_controller.go constructJob l.938-956, labelAndAnnotateObject
  l.1014-1050): the replicated job `node` is the Job <jobset>-node-0 (placement.GenJobName, one
  replica); its pods carry jobset.sigs.k8s.io/jobset-name, replicatedjob-name and job-index = 0;
  their subdomain is the JobSet's name (GetSubdomain, the webhook's default), the Trainer naming
  the JobSet after the TrainJob (plugins/jobset/jobset.go Build).
- The Job controller, completionMode Indexed (kubernetes pkg/controller/job/indexed_job_utils.go
  addCompletionIndexAnnotation, podGenerateNameWithIndex; pkg/controller/job/job_controller.go):
  pod i is named <job>-<i>-<random>, its hostname is <job>-<i>, and it carries
  batch.kubernetes.io/job-completion-index = i as annotation and label.

Not modelled: the Job's restarts (backoffLimit), Kueue's admission and gates, init containers.
"""

import copy
import secrets

NODE = "node"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
TRAINER_PORT = 29500


def _upsert(env: list[dict], added: list[dict]) -> list[dict]:
    names = {e["name"] for e in added}
    return [e for e in env if e["name"] not in names] + added


def trainjob_pods(trainjob: dict, runtime: dict) -> list[dict]:
    """The node pods of `trainjob` on `runtime`, as the controllers create them."""
    name, namespace = trainjob["metadata"]["name"], trainjob["metadata"]["namespace"]
    spec, trainer = trainjob["spec"], trainjob["spec"].get("trainer") or {}
    (replicated,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    template = copy.deepcopy(replicated["template"]["spec"]["template"])
    for patch in spec.get("runtimePatches") or []:
        jobs = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
        for job in jobs:
            if job["name"] != replicated["name"]:
                continue
            own = job["template"]["spec"]["template"]
            template.setdefault("metadata", {}).setdefault("labels", {}).update(
                own.get("metadata", {}).get("labels", {})
            )
            template["spec"].update(own.get("spec", {}))
    container = next(c for c in template["spec"]["containers"] if c["name"] == NODE)
    for key in ("image", "command", "args"):
        if key in trainer:
            container[key] = trainer[key]
    container["env"] = _upsert(container.get("env") or [], trainer.get("env") or [])
    nodes = trainer.get("numNodes", 1)
    procs = trainer.get("numProcPerNode")
    if procs is None:  # "auto": on a pod without GPUs, its CPU request (torch.go l.125-135)
        resources = trainer.get("resourcesPerNode") or container.get("resources") or {}
        limits = resources.get("limits") or {}
        cpu = (resources.get("requests") or {}).get("cpu") or limits.get("cpu") or "0"
        procs = "auto" if "nvidia.com/gpu" in limits else max(1, int(float(str(cpu))))
    pet = [
        {"name": "PET_NNODES", "value": str(nodes)},
        {"name": "PET_NPROC_PER_NODE", "value": str(procs)},
        {
            "name": "PET_NODE_RANK",
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}},
        },
        {"name": "PET_MASTER_ADDR", "value": f"{name}-{NODE}-0-0.{name}"},
        {"name": "PET_MASTER_PORT", "value": str(TRAINER_PORT)},
    ]
    container["env"] = _upsert(container["env"], pet)
    job = f"{name}-{NODE}-0"
    pods = []
    for index in range(nodes):
        pod = copy.deepcopy(template)
        meta = pod.setdefault("metadata", {})
        meta["name"] = f"{job}-{index}-{secrets.token_hex(3)[:5]}"
        meta["namespace"] = namespace
        meta["labels"] = {
            **meta.get("labels", {}),
            "jobset.sigs.k8s.io/jobset-name": name,
            "jobset.sigs.k8s.io/replicatedjob-name": NODE,
            "jobset.sigs.k8s.io/job-index": "0",
            COMPLETION_INDEX: str(index),
        }
        meta["annotations"] = {**meta.get("annotations", {}), COMPLETION_INDEX: str(index)}
        pod["spec"]["hostname"] = f"{job}-{index}"
        pod["spec"]["subdomain"] = name
        pods.append({"apiVersion": "v1", "kind": "Pod", **pod})
    return pods
