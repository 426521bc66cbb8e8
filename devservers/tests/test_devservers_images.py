"""Which images a DevServer may run (devservers.images): references read as the container
runtimes read them (github.com/distribution/reference: regexp.go's grammar, normalize.go's
splitDockerDomain and Docker Hub names), and allowed entries matched by registry and by whole
repository path components, never as substrings."""

import pytest

from devservers.images import ImageError, image_refusal, parse_entry, parse_image

ECR = "123456789012.dkr.ecr.us-west-2.amazonaws.com"
TRAINER = f"{ECR}/tp-dev/trainer"
DIGEST = "sha256:" + "0123456789abcdef" * 4


@pytest.mark.parametrize(
    ("reference", "registry", "repository", "tag", "digest"),
    [
        (f"{TRAINER}:runtime-1", ECR, "tp-dev/trainer", "runtime-1", None),
        (f"{TRAINER}@{DIGEST}", ECR, "tp-dev/trainer", None, DIGEST),
        (f"{TRAINER}:v1@{DIGEST}", ECR, "tp-dev/trainer", "v1", DIGEST),
        # normalize.go: no registry means Docker Hub, and a one-component name is an official
        # image (library/); index.docker.io is Docker Hub's legacy name.
        ("ubuntu:24.04", "docker.io", "library/ubuntu", "24.04", None),
        ("index.docker.io/ubuntu", "docker.io", "library/ubuntu", None, None),
        ("someone/tool", "docker.io", "someone/tool", None, None),
        # A first component with a dot or a port, or localhost, or uppercase, is a registry.
        ("localhost/x", "localhost", "x", None, None),
        ("registry:5000/team/x:1", "registry:5000", "team/x", "1", None),
        ("Registry.Example/x", "registry.example", "x", None, None),
    ],
)
def test_references_are_read_as_container_runtimes_read_them(
    reference, registry, repository, tag, digest
):
    image = parse_image(reference)
    assert (image.registry, image.repository, image.tag, image.digest) == (
        registry,
        repository,
        tag,
        digest,
    )


@pytest.mark.parametrize(
    "reference",
    ["", "team/UPPER", f"{TRAINER}:", f"{TRAINER}@sha256:abc", "a b", f"{TRAINER}/../x", "x" * 300],
)
def test_what_is_no_reference_is_refused(reference):
    with pytest.raises(ImageError, match="is not an image reference"):
        parse_image(reference)
    assert "is not an image reference" in image_refusal(reference, (TRAINER,), False)


@pytest.mark.parametrize(
    ("reference", "allowed"),
    [
        (f"{TRAINER}:runtime-1", True),
        (f"{TRAINER}@{DIGEST}", True),
        (f"{TRAINER}/nested:1", True),  # a repository below the allowed path
        (f"{TRAINER.upper().split('/')[0]}/tp-dev/trainer:1", True),  # hosts ignore case
        # Not the allowed registry, whatever the rest of the string holds:
        (f"evil.com/{TRAINER}:1", False),
        (f"{ECR}.evil.com/tp-dev/trainer:1", False),
        (f"{ECR}:443/tp-dev/trainer:1", False),  # another host:port
        # Not the allowed repository: a sibling that shares a prefix of characters, a parent.
        (f"{ECR}/tp-dev/trainer-evil:1", False),
        (f"{ECR}/tp-dev/devserver-operator:1", False),
        (f"{ECR}/tp-dev:1", False),
        ("tp-dev/trainer:1", False),  # Docker Hub's
    ],
)
def test_an_image_is_allowed_only_from_an_allowed_registry_and_path(reference, allowed):
    refusal = image_refusal(reference, (TRAINER, "ghcr.io/my-org"), require_digest=False)
    assert (refusal is None) is allowed
    if not allowed:
        assert refusal == (
            f"image {reference} is not in a registry this platform allows; allowed: "
            f"{TRAINER}, ghcr.io/my-org"
        )


def test_a_registry_alone_allows_all_its_repositories_and_docker_hub_is_named_in_full():
    assert image_refusal("ghcr.io/anyone/tool:1", ("ghcr.io",), False) is None
    assert image_refusal("ghcr.io.evil.com/tool:1", ("ghcr.io",), False) is not None
    assert image_refusal("ubuntu:24.04", ("docker.io/library",), False) is None
    assert image_refusal("someone/tool", ("docker.io/library",), False) is not None
    assert parse_entry("Localhost:5000/team") == ("localhost:5000", "team")
    assert parse_entry("index.docker.io/library") == ("docker.io", "library")


def test_digests_can_be_required():
    entries = (TRAINER,)
    assert image_refusal(f"{TRAINER}@{DIGEST}", entries, require_digest=True) is None
    refusal = image_refusal(f"{TRAINER}:runtime-1", entries, require_digest=True)
    assert refusal == (
        f"image {TRAINER}:runtime-1 names no digest; allowed: images pinned by digest "
        f"(<repository>@sha256:...) from {TRAINER}"
    )


def test_no_allowed_entry_refuses_everything():
    assert "allowed: none" in image_refusal(f"{TRAINER}:1", (), False)
