"""What a change does to what already runs, for the plan and the pull-request gate: the stack
file's part of the change, then every integration's day-two checks (infra/core/day_two.py, each
in its package's day_two.py), then those of what builds on them: the stack's jobs and runtimes
(workloads/day_two.py) and the DevServers (devservers/day_two.py)."""

from devservers.day_two import HOLDERS as DEVSERVER_HOLDERS
from devservers.day_two import flavors, stranded_homes
from infra.core.change import Change, Consequences, StackJob, Step
from infra.core.day_two import consequences as integration_consequences
from infra.integrations import FACTS
from infra.stack.config import StackConfig
from workloads.day_two import held_revisions, jobs, kinds, runtimes

# In the order their lines appear under each heading.
CHECKS = (jobs, kinds, runtimes, flavors, stranded_homes, held_revisions)


def consequences(
    steps: list[Step],
    config: StackConfig,
    stack: str,
    job_outputs: dict | None = None,
    runtime_outputs: dict | None = None,
) -> Consequences:
    """`job_outputs`, `runtime_outputs`: the stack's outputs of its jobs and runtimes
    (workloads/training_job.py, workloads/training_runtimes.py), where known: what each revision
    holds back."""
    change = Change(
        steps,
        stack,
        frozenset(config.released),
        {pool.name: pool.max_nodes for pool in config.node_pools},
        tuple(StackJob(j.name, j.node_pool, j.checkpoint) for j in config.jobs),
        job_outputs or {},
        runtime_outputs or {},
        {**FACTS.holders, **DEVSERVER_HOLDERS},
        flavors={f.name: f.node_pool for f in config.dev_servers.flavors},
        pool_zones={p.name: p.availability_zone for p in config.node_pools if p.availability_zone},
    )
    return integration_consequences(change, FACTS, CHECKS)
