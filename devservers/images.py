"""Which container images a DevServer may run: the registries and repositories the stack allows.

A reference is read as the container runtimes read it (github.com/distribution/reference,
regexp.go and normalize.go): `[registry[:port]/]path[:tag][@digest]`, where the first path
component is a registry only if it has a `.` or a `:` or is `localhost` (else the image is
Docker Hub's, `library/` for a one-component name). An allowed entry is a registry, optionally
followed by a repository path: an image is allowed when its registry equals the entry's, exactly,
and its repository is the entry's path or lies below it (`/` follows). So neither
`evil.com/123.dkr.ecr...` (registry evil.com) nor `123.dkr.ecr....amazonaws.com.evil.com/...`
(another registry) nor `.../tp-dev/trainer-evil` (another repository) matches an entry
`123.dkr.ecr.us-west-2.amazonaws.com/tp-dev/trainer`.
"""

import re
from dataclasses import dataclass

_ALNUM = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|[-]+)"
_PATH_COMPONENT = rf"{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])"
_REGISTRY = rf"{_HOST}(?::[0-9]+)?"
_PATH = rf"{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
REFERENCE = re.compile(
    rf"(?P<name>(?:{_REGISTRY}/)?{_PATH})(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?"
)
# An allowed entry: a registry, then optionally a repository path below it.
ENTRY = re.compile(rf"(?P<registry>{_REGISTRY})(?:/(?P<path>{_PATH}))?")
DOCKER_HUB = "docker.io"
LEGACY_DOCKER_HUB = ("index.docker.io",)  # normalize.go: legacyDefaultDomain
NAME_MAX = 255  # distribution/reference: NameTotalLengthMax


class ImageError(ValueError):
    """An image reference or an allowed entry that cannot be read."""


@dataclass(frozen=True)
class Image:
    registry: str  # lowercase host, with its port if it had one
    repository: str
    tag: str | None
    digest: str | None


def parse_image(reference: str) -> Image:
    match = REFERENCE.fullmatch(reference)
    if match is None or len(match["name"]) > NAME_MAX:
        raise ImageError(
            f"{reference!r} is not an image reference; allowed: [registry/]repository[:tag]"
            "[@sha256:digest], lowercase repository"
        )
    first, slash, rest = match["name"].partition("/")
    if slash and ("." in first or ":" in first or first == "localhost" or first != first.lower()):
        registry, repository = _registry(first), rest
    else:
        registry, repository = DOCKER_HUB, match["name"]
    if registry == DOCKER_HUB and "/" not in repository:
        repository = f"library/{repository}"  # an official image
    return Image(registry, repository, match["tag"], match["digest"])


def parse_entry(entry: str) -> tuple[str, str]:
    """(registry, repository path prefix; empty: the whole registry) of an allowed entry."""
    match = ENTRY.fullmatch(entry)
    if match is None:
        raise ImageError(
            f"{entry!r} is not a registry or repository; allowed: registry[:port][/path], "
            "e.g. 123456789012.dkr.ecr.us-west-2.amazonaws.com/tp-dev/trainer, without tag or "
            "digest"
        )
    return _registry(match["registry"]), match["path"] or ""


def _registry(host: str) -> str:
    """Host names ignore case; Docker Hub has a legacy name."""
    host = host.lower()
    return DOCKER_HUB if host in LEGACY_DOCKER_HUB else host


def allowed(image: Image, entries: tuple[str, ...]) -> bool:
    for entry in entries:
        registry, path = parse_entry(entry)
        if image.registry == registry and (
            not path or image.repository == path or image.repository.startswith(f"{path}/")
        ):
            return True
    return False


def image_refusal(reference: str, entries: tuple[str, ...], require_digest: bool) -> str | None:
    """Why a server may not run `reference`, naming what is allowed; None when it may."""
    try:
        image = parse_image(reference)
    except ImageError as e:
        return str(e)
    where = ", ".join(entries) or "none (the operator has no allowed registries)"
    if not allowed(image, entries):
        return f"image {reference} is not in a registry this platform allows; allowed: {where}"
    if require_digest and image.digest is None:
        return (
            f"image {reference} names no digest; allowed: images pinned by digest "
            f"(<repository>@sha256:...) from {where}"
        )
    return None
