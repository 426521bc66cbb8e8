"""The contract between the integrations and the engines.

Each integration package (infra/<name>/facts.py) contributes one `Integration`: what it knows
about every resource type it declares (a `Kind`: its price, or why it bills nothing, or what it
bills per use; the input changes that make its provider replace it) and the pods it runs (charts,
EKS add-ons, kustomize overlays), as data. The engines (cost, capacity, replacement) read these
contributions merged into one `Facts` and never name a type token themselves; infra/integrations.py
is the one list of contributions the platform is made of.

Kueue's job integrations (pkg/controller/jobs/<kind>/, registered through jobframework) and
Kubeflow Trainer v2's runtime plugins (pkg/runtime/framework/plugins/, one registry) are the
pattern: one package per upstream system, one typed contract, one list.
"""

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from infra.core.bill import CostLine, PriceBook
from infra.core.change import Change
from infra.core.declared import Declared
from infra.core.pods import AddonPods, ChartPods, OverlayPods, PodSet

TF = "hashicorp/terraform-provider-aws internal/service"
K8S = "pulumi/pulumi-kubernetes provider/pkg/provider/diff.go"

# pulumi-kubernetes: besides .metadata.name and .metadata.namespace of every object.
K8S_METADATA = ("metadata.name", "metadata.namespace")


@dataclass(frozen=True)
class ReplaceRule:
    force_new: tuple[str, ...]
    source: str
    custom: Callable[[dict, dict], list[str]] | None = None


@dataclass(frozen=True)
class ImmutableRule:
    """Fields the API server refuses to change on an existing object (a CRD's CEL rules, `self
    == oldSelf` on a field, `has(self.x) == has(oldSelf.x)` on a field's presence; Kubernetes'
    own validation for built-in kinds), which the provider updates in place: the plan refuses
    such an update, or `pulumi up` would fail half-way through it. Paths are dotted, `[]` for
    every item of a list; `when`: the rule holds only if the old object has this path."""

    paths: tuple[str, ...]
    source: str
    way: str  # how to make the change anyway
    presence: tuple[str, ...] = ()
    when: str | None = None


Pricer = Callable[[Declared, Sequence[Declared], PriceBook], list[CostLine]]
# Reasons shared by kinds of several integrations.
K8S_OBJECT = "a Kubernetes object in etcd: the control plane's hourly rate covers it"
RUNS_ON_NODES = "software whose pods run on nodes the plan prices (system nodes, pools)"


@dataclass(frozen=True)
class Kind:
    """What the platform knows about one resource type: one of `price` (a pricer of its lines of
    the bill), `free` (why it bills nothing) or `usage` (what it bills per GB, request or
    GB-month: infra/jobs/usage.py estimates it where it can), or none where the platform cannot
    price it (listed as unpriced, never $0); and `replace`, the inputs whose change makes its
    provider replace it (None: the provider's defaults, see replacement.py)."""

    type: str
    price: Pricer | None = None
    free: str = ""
    usage: str = ""
    replace: ReplaceRule | None = None
    immutable: ImmutableRule | None = None
    # A multi-language component that stands, offline, for the resource it creates (its children
    # are invisible under mocks): the offline plan's steps treat it as that resource.
    stands_in: bool = False

    def __post_init__(self) -> None:
        if sum(map(bool, (self.price, self.free, self.usage))) > 1:
            raise ValueError(f"{self.type}: one of price, free or usage at most")


@dataclass(frozen=True)
class SystemNodes:
    """The node group the platform's controllers run on: nothing scales it, so its desiredSize
    nodes are all they get (infra/core/capacity.py)."""

    instance_type: str
    desired: int


@dataclass(frozen=True)
class Integration:
    """One upstream system as the engines see it."""

    name: str
    kinds: tuple[Kind, ...] = ()
    # Pod-making components of each Helm chart it installs, by chart (ChartPin.chart).
    charts: Mapping[str, Sequence[ChartPods]] = field(default_factory=dict)
    # Pods of each EKS add-on it installs, by add-on name, at the add-on's defaults.
    addons: Mapping[str, Sequence[AddonPods]] = field(default_factory=dict)
    # Deployments of each kustomize overlay it applies, by directory.
    overlays: Mapping[str, Sequence[OverlayPods]] = field(default_factory=dict)
    # Pods a resource of one of its kinds runs that no chart, add-on or overlay describes.
    pods: Callable[[Declared, Sequence[Declared], "Facts"], list[PodSet]] | None = None
    # Where the system node group is, for the integration that declares it.
    system_nodes: Callable[[Sequence[Declared]], SystemNodes | None] | None = None
    # Lines of the bill no single resource makes (pods the system nodes refuse, on a pool).
    stack_lines: Callable[[Sequence[Declared], PriceBook, "Facts"], list[CostLine]] | None = None
    # The data holders it declares (infra/core/data_holders.py): each key (a stack-config path,
    # or its prefix before `[`) and what losing it loses, in the plan's words.
    holders: Mapping[str, str] = field(default_factory=dict)
    # What a change to its kinds does to what already runs (infra/core/day_two.py), in order.
    day_two: tuple[Callable[[Change], None], ...] = ()


class Facts:
    """Every integration's contribution, merged; a type, chart, add-on or overlay belongs to one
    integration only."""

    def __init__(self, integrations: Iterable[Integration]):
        self.integrations = tuple(integrations)
        self.kinds: dict[str, Kind] = {}
        self.charts: dict[str, Sequence[ChartPods]] = {}
        self.addons: dict[str, Sequence[AddonPods]] = {}
        self.overlays: dict[str, Sequence[OverlayPods]] = {}
        self.holders: dict[str, str] = {}
        owner: dict[str, str] = {}
        for integration in self.integrations:
            for table, entries in (
                (self.kinds, {k.type: k for k in integration.kinds}),
                (self.charts, integration.charts),
                (self.addons, integration.addons),
                (self.overlays, integration.overlays),
                (self.holders, integration.holders),
            ):
                for key, value in entries.items():
                    if key in owner:
                        raise ValueError(f"{key}: both {owner[key]} and {integration.name}")
                    owner[key] = integration.name
                    table[key] = value
        self.owner = owner

    def kind(self, resource_type: str) -> Kind | None:
        return self.kinds.get(resource_type)
