"""The offline plan's recording monitor, under registrations sent at once as the SDK sends them."""

import threading
import time

from google.protobuf import struct_pb2
from pulumi.runtime.proto import resource_pb2

from infra.core.offline import PlatformMocks, RecordingMonitor


class SlowMocks(PlatformMocks):
    """Mocks that hold the registration of `slow` until another one has had time to finish."""

    def __init__(self, slow: str):
        super().__init__("us-west-2")
        self.slow = slow
        self.entered = threading.Event()

    def new_resource(self, args):
        if args.name == self.slow:
            self.entered.set()
            time.sleep(0.5)
        return super().new_resource(args)


def registration(name: str, protect: bool) -> resource_pb2.RegisterResourceRequest:
    return resource_pb2.RegisterResourceRequest(
        type="kubernetes:core/v1:Namespace",
        name=name,
        parent="urn:pulumi:dev::training-platform::pulumi:pulumi:Stack::training-platform-dev",
        custom=True,
        object=struct_pb2.Struct(),
        protect=protect,
        ignoreChanges=[f"{name}-field"],
    )


def test_each_registration_keeps_its_own_options_when_two_arrive_at_once():
    """The SDK registers from executor threads: a namespace's `protect` once went to whichever
    resource was recorded last (a prod plan failed data-holders-protected once in eleven runs)."""
    mocks = SlowMocks(slow="team-ns")
    monitor = RecordingMonitor(mocks)
    slow = threading.Thread(target=monitor.RegisterResource, args=(registration("team-ns", True),))
    slow.start()
    assert mocks.entered.wait(10)
    monitor.RegisterResource(registration("scratch", False))
    slow.join(10)
    recorded = {r.name: (r.protect, r.ignore_changes) for r in monitor.recorded}
    assert recorded == {"team-ns": (True, ["team-ns-field"]), "scratch": (False, ["scratch-field"])}
