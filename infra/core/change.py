"""A change of a stack as the day-two checks read it: each resource's step (what `pulumi up` does
to it: infra/core/steps.py works them out), the consequences the checks word, and what of the
stack file they need."""

from dataclasses import dataclass, field

from infra.core.offline import RecordedResource

CREATE, UPDATE, REPLACE, DELETE = "create", "update", "replace", "delete"


@dataclass
class Step:
    op: str
    urn: str
    type: str
    old: RecordedResource | None
    new: RecordedResource | None
    # Why: the inputs that changed; for a replacement, those that force it.
    reasons: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.urn.rsplit("::", 1)[-1]


@dataclass
class Consequences:
    losses: list[str] = field(default_factory=list)
    # Replacements and deletions of what holds no data, grouped by what causes them.
    replaced: list[str] = field(default_factory=list)
    # What fails the plan as a mandatory policy does, each led by its rule: losses the stack file
    # does not accept (data-loss), a Kubernetes version EKS would refuse (kubernetes-version).
    refusals: list[str] = field(default_factory=list)
    drifts: list[str] = field(default_factory=list)
    restarts: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        sections = [
            ("Data lost", self.losses),
            ("Replaced or deleted (no data lost)", self.replaced),
            (
                "Nodes that drift (replaced by Karpenter once they run no job or DevServer)",
                self.drifts,
            ),
            ("Running work", self.restarts),
            ("Notes", self.notes),
        ]
        out = []
        for title, lines in sections:
            if lines:
                out += [f"  {title}:"] + [f"    {line}" for line in lines]
        return out or ["  nothing that exists is replaced, deleted, drifted or restarted"]


@dataclass(frozen=True)
class StackJob:
    """A job of the stack file, as the day-two checks read it."""

    name: str
    node_pool: str
    checkpoint: str  # its checkpoint store: s3, efs or fsx


@dataclass
class Change:
    """One change of a stack, as every check reads it: its steps, and what of the stack file the
    checks need, in their own terms (no check reads the whole stack config)."""

    steps: list[Step]
    stack: str
    released: frozenset[str]  # holders the stack file accepts losing
    pools: dict[str, int]  # every NodePool: its name and max nodes
    jobs: tuple[StackJob, ...]
    # The stack's outputs of its jobs and runtimes (workloads/revisions.py), where known: what
    # each revision holds back.
    job_outputs: dict = field(default_factory=dict)
    runtime_outputs: dict = field(default_factory=dict)
    # What losing each data holder loses (`Integration.holders`), by key or key prefix.
    losses: dict = field(default_factory=dict)
    found: Consequences = field(default_factory=Consequences)
    # Pools whose nodes drift (infra/karpenter/day_two.py), for the checks of what runs on them.
    drifted: set[str] = field(default_factory=set)
    # Every DevServer flavor: its name and the NodePool its servers run on.
    flavors: dict[str, str] = field(default_factory=dict)
    # The NodePools held to one AZ (EFA pools): name and AZ.
    pool_zones: dict[str, str] = field(default_factory=dict)

    def loss(self, holder: str) -> str:
        """What losing `holder` loses, in words."""
        return self.losses[holder.split("[", 1)[0]]
