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

- A Job's pod failure policy (Kubernetes v1.35): the API server refuses a Job whose
  spec.podFailurePolicy goes with a pod restartPolicy other than Never, more than 20 rules, a
  rule with both or neither of onExitCodes and onPodConditions, exit code values that are not
  1-255 distinct and ordered (0 not with In), or a containerName no container has
  (pkg/apis/batch/validation/validation.go validatePodFailurePolicy and
  validatePodFailurePolicyRuleOnExitCodes). A JobSet whose Job is refused never starts.
  The Job controller takes a failed pod's first matching rule (pkg/controller/job/
  pod_failure_policy.go matchPodFailurePolicy: onExitCodes over the terminated containers'
  exit codes, non-zero only; onPodConditions over the pod's conditions, status True by
  default); no rule matching is Count.

- The training operator v1.9.4 (kubeflow/trainer tag v1.9.4) makes a PyTorchJob's pods:
  defaulting (pkg/apis/kubeflow.org/v1/pytorch_defaults.go) adds the port `pytorchjob-port`
  23456 to the container `pytorch` and nprocPerNode "auto" where unset; pod i of the Worker
  replica is <job>-worker-<i> (pkg/controller.v1/common/pod.go createNewPod, GenGeneralName)
  with the labels training.kubeflow.org/job-name, replica-type `worker`, replica-index i and
  operator-name; restartPolicy ExitCode becomes the pod's Never (pkg/core/pod.go
  SetRestartPolicy). The env appended to every container (pkg/controller.v1/pytorch/envvar.go
  setPodEnv, elastic.go Generate): PYTHONUNBUFFERED=1, PET_NPROC_PER_NODE = nprocPerNode,
  then for an elasticPolicy PET_RDZV_ENDPOINT = <job>-worker-0:<that port>, PET_RDZV_BACKEND,
  PET_NNODES = "min:max", PET_MAX_RESTARTS. A failed pod under ExitCode is replaced for exit
  codes >= 128 (a kill) and fails the job for the others (common/pod.go ReconcilePods,
  pkg/util/train/train_util.go IsRetryableExitCode).

Not modelled: the Job's restarts (backoffLimit), Kueue's admission and gates, init containers.
"""

import copy
import secrets

NODE = "node"
PYTORCH_CONTAINER = "pytorch"
PYTORCH_PORT = ("pytorchjob-port", 23456)
OPERATOR_JOB_NAME = "training.kubeflow.org/job-name"
# What the operator's Services select a replica's pod by (common/job_controller.go GenLabels,
# SetReplicaType, SetReplicaIndex).
OPERATOR_LABELS = (
    OPERATOR_JOB_NAME,
    "training.kubeflow.org/operator-name",
    "training.kubeflow.org/replica-type",
    "training.kubeflow.org/replica-index",
)
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
    refused = pod_failure_policy_errors(replicated["template"]["spec"])
    if refused:  # JobSet's Job create fails: no pod ever starts
        raise ValueError(f"the API server refuses the Job of {name}: {refused}")
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


def pod_failure_policy_errors(job_spec: dict) -> list[str]:
    """What the API server refuses in a Job's pod failure policy (rules in the module's doc)."""
    policy = job_spec.get("podFailurePolicy")
    if policy is None:
        return []
    pod = job_spec["template"]["spec"]
    errors = []
    if pod.get("restartPolicy") != "Never":
        errors.append('spec.podFailurePolicy: only "Never" is supported as restartPolicy')
    rules = policy.get("rules") or []
    if len(rules) > 20:
        errors.append("spec.podFailurePolicy.rules: at most 20")
    containers = {c["name"] for kind in ("containers", "initContainers") for c in pod.get(kind, [])}
    for i, rule in enumerate(rules):
        where = f"spec.podFailurePolicy.rules[{i}]"
        codes, conditions = rule.get("onExitCodes"), rule.get("onPodConditions")
        if (codes is None) == (conditions is None):
            errors.append(f"{where}: exactly one of onExitCodes and onPodConditions")
        if rule.get("action") not in {"FailJob", "FailIndex", "Ignore", "Count"}:
            errors.append(f"{where}.action: unsupported")
        if codes is None:
            continue
        values = codes.get("values") or []
        if codes.get("operator") not in {"In", "NotIn"}:
            errors.append(f"{where}.onExitCodes.operator: In or NotIn")
        if not 1 <= len(values) <= 255 or values != sorted(set(values)):
            errors.append(f"{where}.onExitCodes.values: 1-255 distinct values, ordered")
        if codes.get("operator") == "In" and 0 in values:
            errors.append(f"{where}.onExitCodes.values: 0 not with In")
        name = codes.get("containerName")
        if name is not None and name not in containers:
            errors.append(f"{where}.onExitCodes.containerName: no container {name}")
    return errors


def pod_failure_action(job_spec: dict, exit_codes: dict[str, int], conditions=()) -> str:
    """The Job controller's action for a failed pod: FailJob, FailIndex, Ignore or Count.
    `exit_codes`: container name -> exit code; `conditions`: the pod's True condition types."""
    for rule in (job_spec.get("podFailurePolicy") or {}).get("rules") or []:
        codes = rule.get("onExitCodes")
        if codes is not None:
            values = set(codes["values"])
            for name, code in exit_codes.items():
                if code == 0 or codes.get("containerName") not in (None, name):
                    continue
                if (code in values) == (codes["operator"] == "In"):
                    return rule["action"]
            continue
        for pattern in rule.get("onPodConditions") or []:
            if pattern.get("status", "True") == "True" and pattern["type"] in conditions:
                return rule["action"]
    return "Count"


def pytorchjob_pods(job: dict) -> list[dict]:
    """The Worker pods of `job` (a PyTorchJob), as the training operator creates them."""
    name, namespace, spec = job["metadata"]["name"], job["metadata"]["namespace"], job["spec"]
    worker = spec["pytorchReplicaSpecs"]["Worker"]
    elastic = spec.get("elasticPolicy")
    port_name, port = PYTORCH_PORT
    pods = []
    for index in range(worker.get("replicas", 1)):
        pod = copy.deepcopy(worker["template"])
        meta = pod.setdefault("metadata", {})
        meta.update(name=f"{name}-worker-{index}", namespace=namespace)
        meta["labels"] = {
            **meta.get("labels", {}),
            OPERATOR_JOB_NAME: name,
            "training.kubeflow.org/replica-type": "worker",
            "training.kubeflow.org/replica-index": str(index),
            "training.kubeflow.org/operator-name": "pytorchjob-controller",
        }
        restart = worker.get("restartPolicy", "OnFailure")
        pod["spec"]["restartPolicy"] = "Never" if restart == "ExitCode" else restart
        for container in pod["spec"]["containers"]:
            if container["name"] == PYTORCH_CONTAINER:
                ports = container.setdefault("ports", [])
                if not any(p.get("name") == port_name for p in ports):
                    ports.append({"name": port_name, "containerPort": port})
            env = [
                {"name": "PYTHONUNBUFFERED", "value": "1"},
                {"name": "PET_NPROC_PER_NODE", "value": str(spec.get("nprocPerNode", "auto"))},
            ]
            if elastic:
                low, high = elastic["minReplicas"], elastic["maxReplicas"]
                env += [
                    {"name": "PET_RDZV_ENDPOINT", "value": f"{name}-worker-0:{port}"},
                    {"name": "PET_RDZV_BACKEND", "value": elastic.get("rdzvBackend", "c10d")},
                    {"name": "PET_NNODES", "value": f"{low}:{high}"},
                ]
                if "maxRestarts" in elastic:
                    env.append({"name": "PET_MAX_RESTARTS", "value": str(elastic["maxRestarts"])})
            container["env"] = [*(container.get("env") or []), *env]
        pods.append(pod)
    return pods


def pytorchjob_services(job: dict) -> list[dict]:
    """The headless Service per Worker pod the operator makes (pkg/controller.v1/common/
    service.go CreateNewService): named like the pod, selecting it by the job's labels."""
    name, namespace = job["metadata"]["name"], job["metadata"]["namespace"]
    services = []
    for pod in pytorchjob_pods(job):
        selector = {k: v for k, v in pod["metadata"]["labels"].items() if k in OPERATOR_LABELS}
        services.append(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": pod["metadata"]["name"], "namespace": namespace,
                             "labels": selector},
                "spec": {
                    "clusterIP": "None",
                    "selector": selector,
                    "ports": [{"name": PYTORCH_PORT[0], "port": PYTORCH_PORT[1]}],
                },
            }
        )  # fmt: skip
    assert all(s["metadata"]["name"].startswith(f"{name}-worker-") for s in services)
    return services


def pytorchjob_after_failure(job: dict, exit_code: int) -> str:
    """What the operator does with a failed Worker pod: `restart` (a new pod) or `fail`."""
    restart = job["spec"]["pytorchReplicaSpecs"]["Worker"].get("restartPolicy", "OnFailure")
    if restart == "ExitCode":
        return "restart" if exit_code >= 128 else "fail"
    return "restart" if restart in ("OnFailure", "Always") else "fail"
