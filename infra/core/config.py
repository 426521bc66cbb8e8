"""What every section of the stack config shares: the error type, the strict model base, value
types with their messages, and the helpers that word "allowed: ..." and key paths."""

import difflib
import ipaddress
import json
import re
from typing import Annotated, Any

import pulumi
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
)
from pydantic.alias_generators import to_camel

from infra.core.catalog import (
    load_catalog,
)
from infra.core.regions import AWS_REGIONS

NAMESPACE = "training-platform"


# What a job or DevServer flavor names as its nodePool to run on the hybrid machines: their
# nodes' pool label and their Kueue flavor. No NodePool may take the name.
HYBRID_POOL = "hybrid"


class ConfigError(pulumi.RunError):
    """Invalid stack config. A RunError, so `pulumi up` prints the message without a traceback."""


def retired(data: Any, key: str, why: str) -> Any:
    """A model's raw data, unless it still has `key`, which an earlier version took: for a
    `mode="before"` model validator, so that a stack file written for that version is told why."""
    if isinstance(data, dict) and key in data:
        raise ValueError(f"{key} is gone: {why}; allowed: remove {key}")
    return data


class Model(BaseModel):
    # strict: `minSize: true` or `maxNodes: "4"` is an error, not 1 or 4.
    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        frozen=True,
        hide_input_in_errors=True,
        strict=True,
    )


def allowed_list(values: list[str] | tuple[str, ...], none: str) -> str:
    """`allowed: a, b` or, with nothing to offer, what to do instead."""
    return f"allowed: {', '.join(values)}" if values else none


def did_you_mean(value: str, choices: list[str] | tuple[str, ...]) -> str:
    close = difflib.get_close_matches(value, list(choices), n=1)
    return f"did you mean {close[0]!r}? " if close else ""


def known_region(value: str) -> str:
    if value not in AWS_REGIONS:
        raise ValueError(
            f"{value!r} is not a known AWS region; {did_you_mean(value, AWS_REGIONS)}"
            f"allowed: a region in infra/core/regions.py, e.g. us-west-2"
        )
    return value


def hours(duration: str) -> float:
    units = {"s": 1 / 3600, "m": 1 / 60, "h": 1}
    return sum(int(n) * units[u] for n, u in re.findall(r"([0-9]+)([smh])", duration))


def ipv4_network(value: Any) -> ipaddress.IPv4Network:
    if not isinstance(value, str):
        raise ValueError("must be a string such as 10.0.0.0/16")
    try:
        network = ipaddress.IPv4Network(value, strict=True)
    except ValueError:
        raise ValueError(
            f"{value!r} is not an IPv4 CIDR; allowed: a network address with prefix, "
            "such as 10.0.0.0/16 (host bits zero)"
        ) from None
    return network


Cidr = Annotated[Any, AfterValidator(ipv4_network)]


def _known_instance_type(gpu: bool | None):
    def check(name: str) -> str:
        allowed = load_catalog().names(gpu=gpu)
        if name not in allowed:
            kind = {True: "GPU", False: "CPU", None: "known"}[gpu]
            raise ValueError(
                f"{name!r} is not a {kind} instance type in "
                "infra/core/catalog/instance_types.yaml; "
                f"allowed: {', '.join(allowed)}"
            )
        return name

    return AfterValidator(check)


CpuInstanceType = Annotated[str, _known_instance_type(gpu=False)]


InstanceTypeName = Annotated[str, _known_instance_type(gpu=None)]


K8S_NAME = r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$"


CLUSTER_NAME = r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$"


PATTERN_HINTS = {
    K8S_NAME: "lowercase letters, digits and '-', 1 to 40 characters, alphanumeric at both ends",
    CLUSTER_NAME: "lowercase words joined by single hyphens, e.g. tp-dev (the ECR repository "
    "<name>/trainer allows no uppercase, '--' or trailing '-')",
}


K8sName = Annotated[str, Field(pattern=K8S_NAME)]


Duration = Annotated[str, Field(pattern=r"^([0-9]{1,7}[smh]){1,3}$")]


VpcId = Annotated[str, Field(pattern=r"^vpc-[0-9a-f]{8,17}$")]


SubnetId = Annotated[str, Field(pattern=r"^subnet-[0-9a-f]{8,17}$")]


IAM_PRINCIPAL_ARN = r"^arn:aws[a-z-]*:iam::\d{12}:(role|user)/[\w+=,.@/-]+$"


PATTERN_HINTS[IAM_PRINCIPAL_ARN] = (
    "an IAM role or user ARN, e.g. arn:aws:iam::123456789012:role/platform-admins, or an IAM "
    "Identity Center role with its path, arn:aws:iam::123456789012:role/aws-reserved/"
    "sso.amazonaws.com/<region>/AWSReservedSSO_<permission set>_<suffix> (not an "
    "arn:aws:sts::...:assumed-role/... session)"
)


IamPrincipalArn = Annotated[str, Field(pattern=IAM_PRINCIPAL_ARN)]


# A registry host (with a dot or a port, or localhost, so that it cannot be read as a Docker Hub
# repository), then optionally a repository path: a subset of what the DevServers operator reads
# (devservers/images.py, distribution/reference's grammar), so the operator accepts every entry.
_HOST_LABEL = r"[a-z0-9]([a-z0-9-]*[a-z0-9])?"
_PATH_COMPONENT = r"[a-z0-9]+([._-][a-z0-9]+)*"
IMAGE_REGISTRY = (
    rf"^({_HOST_LABEL}(\.{_HOST_LABEL})+(:[0-9]{{1,5}})?|localhost(:[0-9]{{1,5}})?|"
    rf"{_HOST_LABEL}:[0-9]{{1,5}})(/{_PATH_COMPONENT})*$"
)


PATTERN_HINTS[IMAGE_REGISTRY] = (
    "a registry host, optionally with a repository path and no tag or digest, e.g. "
    "123456789012.dkr.ecr.us-west-2.amazonaws.com/team-images or ghcr.io/my-org; Docker Hub "
    "as docker.io/library (official images) or docker.io/<org>"
)


ImageRegistry = Annotated[str, Field(pattern=IMAGE_REGISTRY, max_length=255)]


class ImageConfig(Model):
    """A prebuilt image by digest, or empty: pulumi up builds its Dockerfile and pushes to ECR."""

    uri: str = Field(
        default="",
        pattern=r"^$|^[a-z0-9.-]+(:[0-9]+)?/[a-z0-9._/-]+@sha256:[a-f0-9]{64}$",
        description="<registry>/<repository>@sha256:<digest>; empty: build and push.",
    )


def one_line(message: str) -> str:
    """Control characters from the config (a key, an argument) escaped: one error, one line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in message)


def key_path(loc: tuple, raw: Any = None) -> str:
    """`training-platform:nodePools[gpu-small].maxNodes`: list items by name where they have one."""
    if loc[:1] == ("region",):
        return "aws:region"
    path = f"{NAMESPACE}:"
    node = raw
    for i, part in enumerate(loc):
        if isinstance(part, int) and not isinstance(part, bool):
            item = node[part] if isinstance(node, list) and part < len(node) else None
            name = item.get("name") if isinstance(item, dict) else None
            if isinstance(name, str) and re.fullmatch(r"[a-z0-9-]{1,63}", name):
                path += f"[{name}]"
            else:
                path += f"[{part}]"
        elif not isinstance(part, str) or not re.fullmatch(r"[\w.-]+", part):
            # a key with spaces or control characters stays one line
            path += f"[{json.dumps(part if isinstance(part, str) else repr(part))}]"
        else:
            path += part if i == 0 else f".{part}"
        if isinstance(node, dict):
            node = node.get(part)
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        else:
            node = None
    return path
