"""Every pin has its release entry (infra/core/releases.py), kept at the pinned version: a bump
that does not say when the new release came out, what is newer and what moving to it does fails
here; and the plan names what moving each pin does to a running stack."""

import json
import re

from deploy.plan import OUTPUTS_FILE, main
from deploy.versions import table
from infra.core import releases, versions
from tests.plugin import ROOT

# Each pin of infra/core/versions.py and its entry: a pin added there without one fails.
PINS = {
    "DEFAULT_KUBERNETES_VERSION": "Kubernetes (EKS), default",
    "KARPENTER_CHART": "Karpenter (karpenter, karpenter-crd charts)",
    "KARPENTER_CRD_CHART": "Karpenter (karpenter, karpenter-crd charts)",
    "MPI_OPERATOR_VERSION": "MPI operator",
    "TRAINING_OPERATOR_VERSION": "Kubeflow training operator (v1, PyTorchJob)",
    "TRAINER_VERSION": "Kubeflow Trainer (v2, TrainJob)",
    "JOBSET_VERSION": "JobSet (with the Trainer)",
    "KUEUE_CHART": "Kueue (kueue chart)",
    "NVIDIA_DEVICE_PLUGIN_CHART": "NVIDIA device plugin chart",
    "EFA_DEVICE_PLUGIN_CHART": "EFA device plugin chart",
    "DCGM_EXPORTER_CHART": "DCGM exporter chart",
    "KUBE_PROMETHEUS_STACK_CHART": "kube-prometheus-stack chart",
    "LOCAL_PATH_PROVISIONER_VERSION": "local-path provisioner",
    "LOCAL_PATH_HELPER_IMAGE": "local-path helper image (busybox)",
    "NODEADM_VERSION": "nodeadm (hybrid nodes)",
    "NVIDIA_CONTAINER_TOOLKIT_VERSION": "NVIDIA container toolkit (hybrid GPU nodes)",
    "CILIUM_CHART": "Cilium (AWS build, hybrid nodes)",
    "KARPENTER_AMI_ALIAS": "AL2023 node AMI (Karpenter alias)",
    "LUSTRE_VERSION": "FSx for Lustre version",
}
# Not releases: what an AWS parameter resolves to at creation, the images by digest that the
# Cilium chart pin carries, the table of Kubernetes versions (each row a pin of its own, above).
NOT_PINS = {"WIREGUARD_GATEWAY_AMI_PARAMETER", "CILIUM_IMAGES", "KUBERNETES_VERSIONS", "ALL_ADDONS"}
REQUIREMENTS = [
    ROOT / "requirements" / "platform.txt",
    ROOT / "requirements" / "dev.txt",
    ROOT / "trainer" / "requirements.txt",
    ROOT / "devservers" / "requirements.txt",
]


def pinned_value(constant: str) -> str:
    value = getattr(versions, constant)
    if hasattr(value, "version"):
        return value.version
    return value.rsplit(":", 1)[1] if constant.endswith("_IMAGE") else value


def test_every_pin_of_versions_py_has_its_release_at_the_pinned_version():
    constants = {n for n in vars(versions) if n.isupper() and not n.startswith("_")}
    assert constants - NOT_PINS == set(PINS)
    by_name = {r.name: r for r in releases.releases()}
    for constant, name in PINS.items():
        assert by_name[name].version == pinned_value(constant), constant


def test_every_sdk_release_is_the_requirements_pin():
    pinned = {}
    for path in REQUIREMENTS:
        for line in path.read_text().splitlines():
            found = re.match(r"^([A-Za-z0-9_.-]+)(\[[^]]*\])?==(\S+)", line)
            if found:
                pinned[found.group(1).lower()] = found.group(3)
    assert {r.name: r.version for r in releases.SDKS} == {
        r.name: pinned[r.name] for r in releases.SDKS
    }


def test_every_deployed_release_says_what_moving_to_it_does():
    assert all(r.moving_here for r in releases.PLATFORM)
    assert all(re.fullmatch(r"\d{4}-\d{2}-\d{2}", r.released[:10]) or "unconfirmed" in r.released
               or r.released == "-" for r in releases.releases())  # fmt: skip


def test_the_table_marks_each_pin_with_a_newer_release():
    lines = table()
    rows = {line.split("  ")[0]: line for line in lines[2:-1]}
    assert rows["Kubeflow Trainer (v2, TrainJob)"].endswith("behind")
    assert not rows["Karpenter (karpenter, karpenter-crd charts)"].endswith("behind")
    behind = sum(r.behind for r in releases.releases())
    assert lines[-1] == f"{behind} of {len(releases.releases())} pins have a newer release"
    assert all(line.endswith("behind") for line in table(behind_only=True)[2:-1])


def test_the_plan_says_what_each_moved_pin_does_to_the_running_stack(tmp_path, capsys):
    base = tmp_path / "base"
    assert main(["--stack", "dev", "--out", str(base)]) == 0
    outputs = json.loads((base / OUTPUTS_FILE).read_text())
    assert outputs[releases.VERSIONS_OUTPUT] == releases.deployed()
    moved_pins = [
        "Kueue (kueue chart)",
        "MPI operator",
        "Karpenter (karpenter, karpenter-crd charts)",
    ]
    outputs[releases.VERSIONS_OUTPUT].update({name: "0.0.1" for name in moved_pins})
    (base / OUTPUTS_FILE).write_text(json.dumps(outputs))
    capsys.readouterr()
    assert main(["--stack", "dev", "--out", str(tmp_path / "new"), "--against", str(base)]) == 0
    printed = capsys.readouterr().out
    moved = [line.strip() for line in printed.splitlines() if " 0.0.1 -> " in line]
    now = releases.deployed()
    # In the runbook's order: Karpenter, the job operators, Kueue.
    assert [m.split(":")[0] for m in moved] == [
        f"{name} 0.0.1 -> {now[name]}" for name in [moved_pins[2], moved_pins[1], moved_pins[0]]
    ]
    assert "first rewrite stored v1beta1 objects as v1beta2" in moved[2]


def test_an_unchanged_pin_says_nothing():
    pin = "Karpenter (karpenter, karpenter-crd charts)"
    assert releases.moves(releases.deployed(), releases.deployed()) == []
    assert releases.moves({pin: "0"}, releases.deployed())[0].startswith(f"{pin} 0 -> ")
