"""`pulumi destroy` simulated on an offline plan: the order the Pulumi engine deletes resources in.

The rules, from the engine and SDK code (pulumi/pulumi; the engine read at the snapshot fetched
on 2026-08-21, commit 1b59498, the Python SDK as installed at the pinned 3.272):

- What must be deleted after a resource R (pkg/resource/graph/dependency_graph.go,
  `DependenciesOf`, with `State.GetAllDependencies` in pkg/resource/state.go): R's parent, every
  URN in R's `dependencies`, `propertyDependencies` and `deletedWith`, and R's provider. A
  dependency on a component (a non-custom resource) also counts as one on that component's
  transitive children (those registered before R).
- What the SDK records (sdk/python lib/pulumi/runtime/resource.py `prepare_resource`): every
  property dependency is merged into `dependencies`; `depends_on` and property dependencies go
  through rpc.py `_add_dependency`, which replaces a *local* ComponentResource by its children
  (recursively) and keeps a *remote* component (pulumi-eks's Cluster, kustomize Directory) as
  itself. So the plan's `dependencies` are already expanded; a remote component's children are
  invisible offline, and its node here stands for all of them (the engine expands a dependency
  on it to its children, and deletes the children before it, their parent).
- `deletedWith` is not recorded by the offline harness; the program sets none (a test checks).
- How deletes run (pkg/resource/deploy/step_generator.go `ScheduleDeletes`, and
  deployment_executor.go): the engine peels the graph into antichains, each the resources whose
  remaining dependencies are all deleted, reverses that list and runs the antichains one after
  another, each in parallel and to completion. The first wave is therefore the resources at the
  end of the longest dependency chains, not every resource without dependents.
- Only a dependency path makes an order certain. A wave is an accident of chain length (any new
  resource can move one), and after a failed delete with `--continue-on-error` the executor
  still deletes everything that is not a dependency of the failed resource
  (deployment_executor.go, `erroredDeps` from `TransitiveDependenciesOf`): a NodePool whose
  drain outlasts its timeout must not let the NAT gateways or Karpenter's IAM go with it.
  `deleted_before` answers with the path.
"""

from collections.abc import Iterable
from dataclasses import dataclass

from infra.core.offline import Plan


@dataclass(frozen=True)
class DestroyOrder:
    outlived_by: dict[str, frozenset[str]]  # urn -> the urns deleted only after it

    @classmethod
    def of(cls, plan: Plan) -> "DestroyOrder":
        recorded = {r.urn: r for r in plan.resources}
        edges: dict[str, set[str]] = {}
        for resource in plan.resources:
            after = set(resource.dependencies)
            if resource.parent:
                after.add(resource.parent)
            if resource.provider:  # "<urn>::<id>"; default providers are not registered offline
                after.add(resource.provider.rsplit("::", 1)[0])
            for urn in resource.dependencies:
                dependency = recorded.get(urn)
                if dependency is not None and not dependency.custom:
                    # The SDK expands local components itself; only remote ones may be named.
                    assert dependency.type.split(":")[0] != "training-platform", (
                        f"{resource.name} names the local component {dependency.name}"
                    )
            edges[resource.urn] = after
        for urn in {u for after in edges.values() for u in after} - edges.keys():
            edges[urn] = set()  # a remote component's invisible child, e.g. the EKS control plane
        edges.pop("", None)  # the stack itself (parent of top-level resources) is not deleted
        for after in edges.values():
            after.discard("")
        return cls({urn: frozenset(after) for urn, after in edges.items()})

    def waves(self) -> list[list[str]]:
        """The antichains `ScheduleDeletes` returns, in the order the executor runs them."""
        condemned, chains = set(self.outlived_by), []
        while condemned:
            chain = sorted(u for u in condemned if not self.outlived_by[u] & condemned)
            assert chain, f"dependency cycle among {sorted(condemned)}"
            condemned -= set(chain)
            chains.append(chain)
        return chains[::-1]

    def deleted_after(self, urn: str) -> set[str]:
        """Every resource the engine deletes only once `urn` is gone: its dependencies, the
        dependencies' dependencies, and so on."""
        seen, todo = set(), list(self.outlived_by[urn])
        while todo:
            next_urn = todo.pop()
            if next_urn not in seen:
                seen.add(next_urn)
                todo += self.outlived_by[next_urn]
        return seen

    def deleted_before(self, first: str, second: str) -> bool:
        """Is `first` certainly deleted, and its delete finished, before `second`'s starts?"""
        return second in self.deleted_after(first)

    def not_outlived(self, first: str, seconds: Iterable[str]) -> list[str]:
        """Those of `seconds` that the engine may delete before `first` is gone."""
        after = self.deleted_after(first)
        return sorted(s for s in seconds if s not in after)
