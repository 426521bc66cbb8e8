"""Every custom resource in every stack's plan validates against its upstream CRD."""

import copy
import hashlib
import re
import subprocess

import pytest

from infra.core.tests.crd_schema import cel_violations, conformance_errors
from tests.plugin import ROOT, STACKS

# Kubernetes' own API groups (validated by the API server, not by CRDs) and Pulumi wrappers.
BUILT_IN = {
    "core",
    "apps",
    "batch",
    "policy",
    "rbac.authorization.k8s.io",
    "storage.k8s.io",
    "networking.k8s.io",
    "scheduling.k8s.io",
    "apiextensions.k8s.io",
    "admissionregistration.k8s.io",
}
NOT_OBJECTS = {"helm.sh", "kustomize", "yaml"}


def custom_resources(plan):
    return [
        r
        for r in plan.resources
        if r.type.startswith("kubernetes:")
        and r.type.split(":")[1].split("/")[0] not in BUILT_IN | NOT_OBJECTS
    ]


@pytest.mark.parametrize("stack", STACKS)
def test_every_custom_resource_conforms_to_its_served_crd_version(stack, request):
    """Schema and CEL rules (x-kubernetes-validations), as the API server checks a create."""
    plan = request.getfixturevalue(f"{stack}_plan")
    resources = custom_resources(plan)
    kinds = {r.inputs["kind"] for r in resources}
    assert {"NodePool", "EC2NodeClass", "ResourceFlavor", "ClusterQueue", "LocalQueue"} <= kinds
    failures = {r.name: conformance_errors(r.inputs) + cel_violations(r.inputs) for r in resources}
    assert {name: errors for name, errors in failures.items() if errors} == {}


def first(plan, kind):
    return copy.deepcopy(next(r.inputs for r in custom_resources(plan) if r.inputs["kind"] == kind))


@pytest.mark.parametrize(
    ("kind", "mutate", "expected"),
    [
        (
            "NodePool",
            lambda m: m["spec"]["disruption"].update(consolidateAftr="5m"),
            "consolidateAftr",
        ),
        (
            "NodePool",
            lambda m: m["spec"]["disruption"].update(consolidationPolicy="WhenIdle"),
            "'WhenIdle' is not one of",
        ),
        ("NodePool", lambda m: m.update(apiVersion="karpenter.sh/v1beta1"), "not served"),
        (
            "EC2NodeClass",
            lambda m: m["spec"]["metadataOptions"].update(httpTokens="always"),
            "'always' is not one of",
        ),
        ("ClusterQueue", lambda m: m["spec"].update(cohort="x"), "'cohort' was unexpected"),
        (
            "ClusterQueue",
            lambda m: m["spec"]["preemption"].update(reclaimWithinCohort="Sometimes"),
            "'Sometimes' is not one of",
        ),
        ("ClusterQueue", lambda m: m.update(apiVersion="kueue.x-k8s.io/v1alpha1"), "not served"),
        ("LocalQueue", lambda m: m["spec"].update(clusterQueueName="platform"), "clusterQueueName"),
        ("ResourceFlavor", lambda m: m["spec"].update(nodeLabel={"a": "b"}), "nodeLabel"),
    ],
)
def test_conformance_catches_misspellings_bad_enums_and_wrong_versions(
    dev_plan, kind, mutate, expected
):
    manifest = first(dev_plan, kind)
    assert conformance_errors(manifest) == []
    mutate(manifest)
    errors = conformance_errors(manifest)
    assert any(expected in e for e in errors), errors


def test_the_crd_files_match_the_checksums_in_sources_md():
    """tests/crds holds the CRDs copied from the steering repository's shared data, byte for
    byte: its SOURCES.md names each and its sha256, and nothing else is there."""
    vendored = ROOT / "tests" / "crds"
    sources = (vendored / "SOURCES.md").read_text()
    listed = dict(
        reversed(line.split()) for line in re.findall(r"^[0-9a-f]{64}  \S+$", sources, re.M)
    )
    present = {str(p.relative_to(vendored)) for p in vendored.rglob("*") if p.suffix != ".md"}
    present -= {str(p.relative_to(vendored)) for p in vendored.rglob("*") if p.is_dir()}
    assert present and set(listed) == present
    for name, digest in listed.items():
        assert hashlib.sha256((vendored / name).read_bytes()).hexdigest() == digest, name


def test_nothing_in_the_repository_reads_outside_it():
    """A clone has only the repository: no tracked source may climb above the project."""
    root = ROOT
    tracked = subprocess.run(
        ["git", "ls-files", "*.py", "Makefile", "*.yml", "*.yaml", "*.toml", ".ci/*"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    outside = re.compile(r"\.\./shared|parents\[[2-9]\]|\.\./\.\./")
    offenders = [
        f"{name}:{n}"
        for name in tracked
        if (root / name).is_file() and not name.startswith("tests/crds/")
        for n, line in enumerate((root / name).read_text().splitlines(), 1)
        if outside.search(line) and "outside = re.compile" not in line
    ]
    assert offenders == []


def test_no_upstream_source_or_crd_is_copied_in():
    """Upstream rules the tests need are written down in our own data structures, citing the
    upstream file, never copied: no Go source, and no CustomResourceDefinition but the project's
    own and those tests/crds holds from the steering repository's shared data."""
    root = ROOT
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True
    ).stdout.split()
    allowed = ("tests/crds/", "devservers/crds/")
    copies = [
        name
        for name in tracked
        if name.endswith(".go")
        or (
            name.endswith((".yaml", ".yml"))
            and not name.startswith(allowed)
            and (root / name).is_file()
            and re.search(r"^kind: CustomResourceDefinition$", (root / name).read_text(), re.M)
        )
    ]
    assert copies == []
