"""What a change does to the stores that running pods mount or that expire what they hold: a lost
file system stops the pods on it, a shorter bucket lifecycle deletes objects, a claim bound to
another volume shows its pods other files."""

import json
import re

from infra.core.change import DELETE, REPLACE, UPDATE, Step
from infra.core.day_two import Change, accepting, holder_of
from infra.core.declared import dig, listed
from infra.core.kinds import NAMESPACE
from infra.storage.facts import BUCKET, CLAIM, EFS, FSX, LIFECYCLE

# Holders that running pods mount: (the jobs' checkpoint store there, what it is called).
MOUNTED = {FSX: ("fsx", "FSx for Lustre"), EFS: ("efs", "EFS")}


def _mounted_lost(holder: str, change: Change) -> str:
    """What losing a file system that pods mount does to them."""
    store, what = MOUNTED[holder]
    line = (
        f"every pod that mounts {what} loses it, and the update waits for them: stop the jobs, "
        f"TrainJobs, TensorBoards (and DevServers, for EFS) that use it first"
    )
    on_it = sorted(j.name for j in change.jobs if j.checkpoint == store)
    if on_it:
        line += f"; {', '.join(on_it)} checkpoint there"
        if store == "fsx":
            line += " and resume from what reached the bucket"
    return line


def mounted_lost(change: Change) -> None:
    """A file system that pods mount, replaced or deleted: the pods lose it."""
    lost: set[str] = set()
    for step in change.steps:
        holder = holder_of(step.old) if step.op in (REPLACE, DELETE) else None
        if holder in MOUNTED and holder not in lost:
            lost.add(holder)
            change.found.restarts.append(_mounted_lost(holder, change))


def deleting_updates(steps: list[Step]) -> list[tuple[str, str]]:
    """(holder, what it deletes) of the in-place updates that delete data: an expiry in the
    bucket's lifecycle that reaches objects sooner than before (a shorter one, one on a prefix no
    rule expired, whatever its rule's id) deletes them as soon as S3 applies it (daily)."""
    found = []
    for step in steps:
        if step.type != LIFECYCLE or step.op != UPDATE:
            continue
        for path, what in (
            (("expiration", "days"), "objects"),
            (("noncurrentVersionExpiration", "noncurrentDays"), "old versions of objects"),
        ):
            before = _expiries(step.old.inputs, path)
            for prefix, now in _expiries(step.new.inputs, path):
                # Objects under `prefix` expired, before, after the least days of the rules
                # whose prefix covers them.
                was = min((d for p, d in before if prefix.startswith(p)), default=None)
                if was is not None and now >= was:
                    continue
                shown = prefix or "the whole bucket"
                since = f"{was} -> {now} days" if was else f"{now} days, where nothing expired"
                found.append(
                    (
                        BUCKET,
                        f"{step.name} ({BUCKET}) would be updated to delete the {what} under "
                        f"{shown} older than {now} days ({since})",
                    )
                )
    return found


def _expiries(lifecycle: dict, path: tuple[str, str]) -> list[tuple[str, int]]:
    """(prefix, days) of a lifecycle's enabled rules that expire after days at `path`."""
    return [
        (str(dig(rule, "filter", "prefix") or ""), int(dig(rule, *path)))
        for rule in listed(dig(lifecycle, "rules"))
        if rule.get("status") == "Enabled" and dig(rule, *path)
    ]


def expiring(change: Change) -> None:
    for holder, line in deleting_updates(change.steps):
        change.found.losses.append(line)
        if holder not in change.released:
            change.found.refusals.append(f"data-loss: {line}; {accepting(holder)}")


def rebound_claims(change: Change) -> None:
    """A claim bound to another volume keeps its name: the pods that mount it see other files from
    their next start, while the old volume keeps its own (a Retain volume stays, Released)."""
    for step in change.steps:
        rebound = [
            r for r in step.reasons if r.startswith(("spec.volumeName", "spec.storageClass"))
        ]
        if step.type == CLAIM and step.op == REPLACE and rebound:
            meta = step.new.inputs.get("metadata") or {}
            change.found.notes.append(
                f"claim {meta.get('namespace')}/{meta.get('name')} is bound to another volume "
                f"({', '.join(rebound)}): its pods see that volume's files from their next start "
                "(the old volume's stay on it): copy across what they must keep seeing"
            )


def deleted_claims(steps: list[Step]) -> set[tuple[str, str]]:
    """(namespace, name) of the claims an update deletes, but in namespaces it deletes: what ran
    there goes with them."""
    gone = {
        str(dig(s.old.inputs, "metadata", "name"))
        for s in steps
        if s.type == NAMESPACE and s.op == DELETE
    }
    claims = {
        (
            str(dig(s.old.inputs, "metadata", "namespace")),
            str(dig(s.old.inputs, "metadata", "name")),
        )
        for s in steps
        if s.type == CLAIM and s.op == DELETE
    }
    return {(ns, name) for ns, name in claims if ns not in gone}


def mounts_deleted(manifest: dict, what: str, deleted: set[tuple[str, str]]) -> list[str]:
    """The claims a kept manifest's pods mount that are deleted: in its namespace for a job, in
    any (the team namespaces its TrainJobs run in) for a cluster-wide runtime."""
    claims = set(re.findall(r'"claimName": "([^"]+)"', json.dumps(manifest)))
    namespace = dig(manifest, "metadata", "namespace")
    return sorted(
        f"{ns}/{claim}" if what == "runtime" else claim
        for ns, claim in deleted
        if claim in claims and (what == "runtime" or ns == namespace)
    )
