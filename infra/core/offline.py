"""Run the real Pulumi program offline, under the SDK's mock runtime, and record what it declares.

This is the harness behind `python -m deploy.plan` and the tests. It differs from the stock
MockMonitor in one way that matters: resource inputs are recorded in their wire form, with
resource references kept as `{"$ref": urn}` instead of being rehydrated on a worker thread, which
hangs or fails about half the time (pulumi/pulumi#6561).
"""

import asyncio
import base64
import hashlib
import json
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pulumi
from google.protobuf import json_format, struct_pb2
from pulumi.runtime import mocks, settings
from pulumi.runtime.config import set_all_config
from pulumi.runtime.proto import resource_pb2
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

from infra.core.paths import PROGRAM_DIR

PROJECT = "training-platform"
# What `pulumi.get_organization()` returns on a DIY backend (the Pulumi Cloud: your org's name).
ORGANIZATION = "organization"
ACCOUNT_ID = "123456789012"

# Special signatures of the Pulumi wire format (sdk/go/common/resource/sig).
_SIG = "4dabf18193072939515e22adb298388d"
_RESOURCE_REF = "5cf8f73096256a8f31e491e813e4eb8e"
_SECRET = "1b47061264138c4ac30d75fd1eb44270"
_UNKNOWN = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"
SECRET = "[secret]"


@dataclass
class RecordedResource:
    urn: str
    type: str
    name: str
    parent: str
    provider: str
    dependencies: list[str]
    inputs: dict[str, Any]
    custom: bool
    protect: bool = False
    # The engine deletes the old resource before it creates its replacement.
    delete_before_replace: bool = False
    # Inputs whose changes the engine ignores, keeping the deployed values (ignoreChanges).
    ignore_changes: list[str] = field(default_factory=list)
    # Deleting it from the stack leaves the cloud resource in place (retainOnDelete).
    retain_on_delete: bool = False
    # What the resource's dependents may read of it: its id and the string outputs the provider
    # computes (arn, dnsName, ...). A dependent whose inputs hold one of them changes when this
    # resource is replaced (infra/core/steps.py).
    outputs: dict[str, str] = field(default_factory=dict)

    def as_plan_entry(self) -> dict[str, Any]:
        return {
            "urn": self.urn,
            "type": self.type,
            "name": self.name,
            "parent": self.parent,
            "provider": self.provider,
            "dependencies": self.dependencies,
            "inputs": self.inputs,
            "custom": self.custom,
            "protect": self.protect,
            "deleteBeforeReplace": self.delete_before_replace,
            "ignoreChanges": self.ignore_changes,
            "outputs": self.outputs,
            # Only where set, so the entries of every other resource read as before.
            **({"retainOnDelete": True} if self.retain_on_delete else {}),
        }

    @classmethod
    def from_plan_entry(cls, entry: dict[str, Any]) -> "RecordedResource":
        return cls(
            urn=entry["urn"],
            type=entry["type"],
            name=entry["name"],
            parent=entry["parent"],
            provider=entry["provider"],
            dependencies=entry["dependencies"],
            inputs=entry["inputs"],
            custom=entry.get("custom", _custom(entry["type"])),
            protect=entry.get("protect", False),
            delete_before_replace=entry.get("deleteBeforeReplace", False),
            ignore_changes=entry.get("ignoreChanges", []),
            retain_on_delete=entry.get("retainOnDelete", False),
            outputs=entry.get("outputs", {}),
        )


# The packaged (multi-language) components the program registers: with its own components, all
# that is not a custom resource. For plans written before `custom` was recorded.
PACKAGED_COMPONENTS = {
    "eks:index:Cluster",
    "kubernetes:kustomize/v2:Directory",
    "kubernetes:helm.sh/v4:Chart",
}


def _custom(type_: str) -> bool:
    return not type_.startswith(f"{PROJECT}:") and type_ not in PACKAGED_COMPONENTS


@dataclass
class Plan:
    stack: str
    resources: list[RecordedResource] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)
    region: str = ""  # aws:region, which every AWS resource's provider is configured with

    def of_type(self, type_: str) -> list[RecordedResource]:
        return [r for r in self.resources if r.type == type_]

    def one(self, type_: str, name: str | None = None) -> RecordedResource:
        found = [r for r in self.of_type(type_) if name is None or r.name == name]
        if len(found) != 1:
            names = [r.name for r in self.of_type(type_)]
            raise LookupError(f"expected one {type_} named {name!r}, found {names}")
        return found[0]

    def by_urn(self, urn: str) -> RecordedResource:
        return next(r for r in self.resources if r.urn == urn)


def plain(value: Any) -> Any:
    """Wire-form value -> JSON data: refs become {"$ref": urn}, secrets "[secret]", unknowns None.

    Secrets are redacted because plans are uploaded as CI artifacts.
    """
    if isinstance(value, dict):
        sig = value.get(_SIG)
        if sig == _RESOURCE_REF:
            return {"$ref": value["urn"]}
        if sig == _SECRET:
            return SECRET
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if value == _UNKNOWN:
        return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _fake_id(type_: str, name: str) -> str:
    digest = hashlib.sha256(f"{type_}/{name}".encode()).hexdigest()
    prefix = {
        "aws:ec2/vpc:Vpc": "vpc-",
        "aws:ec2/subnet:Subnet": "subnet-",
        "aws:ec2/securityGroup:SecurityGroup": "sg-",
        "aws:ec2/natGateway:NatGateway": "nat-",
        "aws:ec2/internetGateway:InternetGateway": "igw-",
        "aws:ec2/eip:Eip": "eipalloc-",
        "aws:ec2/routeTable:RouteTable": "rtb-",
        "aws:ec2/launchTemplate:LaunchTemplate": "lt-",
        "aws:ec2/instance:Instance": "i-",
        "aws:fsx/lustreFileSystem:LustreFileSystem": "fs-",
        "aws:efs/fileSystem:FileSystem": "fs-",
        "aws:efs/accessPoint:AccessPoint": "fsap-",
    }.get(type_)
    return f"{prefix}{digest[:17]}" if prefix else f"{name}-{digest[:8]}"


# EFS ARNs name the kind and the id (EFS user guide, resource types defined by Amazon EFS), which
# IAM conditions on access points compare.
EFS_ARN_KINDS = {
    "aws:efs/fileSystem:FileSystem": "file-system",
    "aws:efs/accessPoint:AccessPoint": "access-point",
}


def partition_of(region: str) -> str:
    """The AWS partition a region belongs to."""
    if region.startswith("cn-"):
        return "aws-cn"
    return "aws-us-gov" if region.startswith("us-gov-") else "aws"


class PlatformMocks(mocks.Mocks):
    """Outputs shaped like the real providers' for the properties the program reads back."""

    def __init__(
        self,
        region: str,
        partition: str | None = None,
        deployed_outputs: Mapping[str, Any] | None = None,
    ):
        self.region = region
        self.partition = partition or partition_of(region)
        # What a StackReference to the stack itself reads: the outputs of its last update.
        self.deployed_outputs = dict(deployed_outputs or {})
        self.extra_registrations: list[tuple[str, str, dict]] = []

    def call(self, args: mocks.MockCallArgs):
        if args.token == "aws:index/getAvailabilityZones:getAvailabilityZones":
            names = [f"{self.region}{s}" for s in "abc"]
            return {
                "names": names,
                "zoneIds": [f"use1-az{i}" for i in (1, 2, 4)],
                "id": self.region,
            }, []
        if args.token == "aws:index/getCallerIdentity:getCallerIdentity":
            arn = f"arn:{self.partition}:iam::{ACCOUNT_ID}:user/offline"
            return {
                "accountId": ACCOUNT_ID,
                "arn": arn,
                "userId": "AIDAOFFLINE",
                "id": ACCOUNT_ID,
            }, []
        if args.token == "aws:index/getPartition:getPartition":
            return {
                "partition": self.partition,
                "dnsSuffix": "amazonaws.com.cn" if self.partition == "aws-cn" else "amazonaws.com",
                "id": self.partition,
            }, []
        if args.token == "aws:ecr/getAuthorizationToken:getAuthorizationToken":
            return {
                "userName": "AWS",
                "password": "offline-token",
                "authorizationToken": "T0ZGTElORQ==",
                "proxyEndpoint": f"https://{ACCOUNT_ID}.dkr.ecr.{self.region}.amazonaws.com",
                "id": "t",
            }, []
        if args.token == "aws:index/getRegion:getRegion":
            return {"name": self.region, "region": self.region, "id": self.region}, []
        if args.token == "aws:ssm/getParameter:getParameter":  # a public AMI parameter
            name = args.args["name"]
            ami = "ami-" + hashlib.sha256(name.encode()).hexdigest()[:17]
            return {
                "name": name,
                "value": ami,
                "insecureValue": ami,
                "type": "String",
                "id": name,
            }, []
        raise NotImplementedError(f"offline plan has no mock for invoke {args.token}")

    def new_resource(self, args: mocks.MockResourceArgs):
        if args.typ == "pulumi:pulumi:StackReference":
            name = args.inputs.get("name") or args.resource_id
            state = {"name": name, "outputs": self.deployed_outputs, "secretOutputNames": []}
            return name, state
        id_ = _fake_id(args.typ, args.name)
        outputs = dict(args.inputs)
        outputs.setdefault("arn", self._arn(args.typ, args.name))
        if args.typ.startswith("aws:"):
            # The engine auto-names resources created without an explicit name.
            outputs.setdefault("name", f"{args.name}-{id_[-7:]}")
        if args.typ == "eks:index:Cluster":
            outputs.update(self._eks_cluster_outputs(args.inputs))
        elif args.typ == "aws:iam/role:Role":
            outputs["arn"] = f"arn:{self.partition}:iam::{ACCOUNT_ID}:role/{outputs['name']}"
        elif args.typ == "aws:kms/key:Key":
            outputs["keyId"] = id_
            outputs["arn"] = f"arn:{self.partition}:kms:{self.region}:{ACCOUNT_ID}:key/{id_}"
        elif args.typ == "aws:s3/bucket:Bucket":
            outputs.setdefault("bucket", f"{args.name}-{id_[-7:]}")
            outputs["arn"] = f"arn:{self.partition}:s3:::{outputs['bucket']}"
        elif args.typ in EFS_ARN_KINDS:
            outputs["arn"] = (
                f"arn:{self.partition}:elasticfilesystem:{self.region}:{ACCOUNT_ID}:"
                f"{EFS_ARN_KINDS[args.typ]}/{id_}"
            )
        elif args.typ == "aws:fsx/lustreFileSystem:LustreFileSystem":
            outputs["dnsName"] = f"{id_}.fsx.{self.region}.amazonaws.com"
            outputs["mountName"] = id_[-8:]
        elif args.typ == "docker-build:index:Image":
            outputs["digest"] = (
                "sha256:"
                + hashlib.sha256(json.dumps(args.inputs, sort_keys=True).encode()).hexdigest()
            )
        elif args.typ == "aws:ecr/repository:Repository":
            outputs["registryId"] = ACCOUNT_ID
            outputs["repositoryUrl"] = (
                f"{ACCOUNT_ID}.dkr.ecr.{self.region}.amazonaws.com/{args.inputs['name']}"
            )
        elif args.typ == "aws:ec2/launchTemplate:LaunchTemplate":
            outputs["latestVersion"] = 1
        elif args.typ == "random:index/randomBytes:RandomBytes":
            raw = hashlib.sha256(args.name.encode()).digest()[: int(args.inputs["length"])]
            outputs.update(base64=base64.b64encode(raw).decode(), hex=raw.hex())
        elif args.typ == "aws:ssm/activation:Activation":
            outputs["activationCode"] = f"offline-activation-code-{id_[-8:]}"
        elif args.typ == "aws:ec2/instance:Instance":
            outputs["primaryNetworkInterfaceId"] = "eni-" + id_.removeprefix("i-")
        elif args.typ == "aws:ec2/eip:Eip":
            outputs["publicIp"] = "203.0.113.10"  # TEST-NET-3: documentation addresses
        elif args.typ.startswith("kubernetes:") and "metadata" in outputs:
            outputs["metadata"] = {**{"name": args.name}, **(outputs["metadata"] or {})}
        return id_, outputs

    def _arn(self, type_: str, name: str) -> str:
        service = type_.split(":")[1].split("/")[0]
        return f"arn:{self.partition}:{service}:{self.region}:{ACCOUNT_ID}:{name}"

    def _eks_cluster_outputs(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        name = inputs["name"]
        endpoint = f"https://{hashlib.sha256(name.encode()).hexdigest()[:32].upper()}.gr7.{self.region}.eks.amazonaws.com"
        cluster_sg = _fake_id("aws:ec2/securityGroup:SecurityGroup", f"{name}-eks-cluster-sg")
        kubeconfig = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": name,
                    "cluster": {"server": endpoint, "certificate-authority-data": "T0ZGTElORQ=="},
                }
            ],
            "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
            "current-context": name,
            "users": [
                {
                    "name": name,
                    "user": {
                        "exec": {
                            "apiVersion": "client.authentication.k8s.io/v1beta1",
                            "command": "aws",
                            "args": [
                                "eks",
                                "get-token",
                                "--cluster-name",
                                name,
                                "--region",
                                self.region,
                            ],
                        }
                    },
                }
            ],
        }
        # The aws:eks Cluster that pulumi-eks creates is invisible under mocks; register a stand-in
        # so that the `eksCluster` resource reference points at a known URN.
        eks_type = "aws:eks/cluster:Cluster"
        eks_urn = f"urn:pulumi:{pulumi.get_stack()}::{PROJECT}::{eks_type}::{name}-eksCluster"
        eks_state = {
            "name": name,
            "arn": f"arn:{self.partition}:eks:{self.region}:{ACCOUNT_ID}:cluster/{name}",
            "endpoint": endpoint,
            "version": inputs.get("version"),
            "vpcConfig": {"clusterSecurityGroupId": cluster_sg, "vpcId": inputs.get("vpcId")},
            "certificateAuthority": {"data": "T0ZGTElORQ=="},
        }
        self.extra_registrations.append((eks_urn, f"{name}-eksCluster", eks_state))
        return {
            "kubeconfigJson": json.dumps(kubeconfig, sort_keys=True),
            "kubeconfig": kubeconfig,
            "clusterSecurityGroupId": cluster_sg,
            "eksCluster": {_SIG: _RESOURCE_REF, "urn": eks_urn, "id": name, "packageVersion": ""},
        }


class RecordingMonitor(mocks.MockMonitor):
    """MockMonitor that records each registration's wire-form inputs and never rehydrates refs."""

    def Invoke(self, request):
        try:
            return super().Invoke(request)
        finally:
            # The SDK gives each executor thread an event loop and never closes it; one left
            # to the garbage collector at interpreter exit prints a spurious traceback.
            if threading.current_thread() is not threading.main_thread():
                loop = asyncio.get_event_loop()
                if not loop.is_running():
                    loop.close()
                    asyncio.set_event_loop(None)

    def __init__(self, platform_mocks: PlatformMocks):
        super().__init__(platform_mocks)
        self.mocks: PlatformMocks = platform_mocks
        self.recorded: list[RecordedResource] = []
        # The SDK sends each registration from an executor thread, several at once: one at a
        # time here, so a registration's record and the mocks' extra registrations are its own.
        self.lock = threading.Lock()

    def RegisterResource(self, request):
        urn = self.make_urn(request.parent, request.type, request.name)
        if request.type == "pulumi:pulumi:Stack":
            return resource_pb2.RegisterResourceResponse(urn=urn)
        inputs = plain(json_format.MessageToDict(request.object))
        with self.lock:
            id_, state = self.mocks.new_resource(
                mocks.MockResourceArgs(
                    typ=request.type,
                    name=request.name,
                    inputs=inputs,
                    provider=request.provider,
                    resource_id=request.importId,
                    custom=request.custom,
                )
            )
            self.resources[urn] = mocks.MockMonitor.ResourceRegistration(urn, id_, state)
            while self.mocks.extra_registrations:
                extra_urn, extra_id, extra_state = self.mocks.extra_registrations.pop()
                self.resources[extra_urn] = mocks.MockMonitor.ResourceRegistration(
                    extra_urn, extra_id, extra_state
                )
            self.recorded.append(
                RecordedResource(
                    urn=urn,
                    type=request.type,
                    name=request.name,
                    parent=request.parent,
                    provider=request.provider,
                    dependencies=sorted(set(request.dependencies)),
                    inputs=inputs,
                    custom=bool(request.custom),
                    protect=request.protect,
                    delete_before_replace=request.deleteBeforeReplace,
                    ignore_changes=list(request.ignoreChanges),
                    retain_on_delete=request.retainOnDelete,
                    outputs={
                        "id": id_,
                        **{
                            k: v
                            for k, v in state.items()
                            if isinstance(v, str) and inputs.get(k) != v
                        },
                    },
                )
            )
        obj = struct_pb2.Struct()
        obj.update(state)
        return resource_pb2.RegisterResourceResponse(urn=urn, id=id_, object=obj)


def _ensure_event_loop() -> None:
    """The SDK registers resources on the thread's event loop; asyncio.run, run earlier in the
    same process (kopf, a test), leaves the main thread with none, or a closed one."""
    policy = asyncio.get_event_loop_policy()
    try:
        if not policy.get_event_loop().is_closed():
            return
    except RuntimeError:
        pass
    policy.set_event_loop(policy.new_event_loop())


def run_offline(
    program: Callable[[], None],
    stack: str,
    config: Mapping[str, Any],
    partition: str | None = None,
    deployed_outputs: Mapping[str, Any] | None = None,
) -> Plan:
    """Run `program` as `pulumi up` would, against mocks, with `config` as the stack's config,
    in the working directory the engine gives it (Pulumi.yaml's `main:`).

    `config` is the flat `config:` map of a stack file; structured values are passed as JSON
    strings, as the Pulumi engine does. `deployed_outputs` are the stack's outputs as its last
    update left them (what a StackReference to the stack itself reads); none: a new stack.
    """
    _ensure_event_loop()
    region = str(config.get("aws:region", "us-east-1"))
    monitor = RecordingMonitor(PlatformMocks(region, partition, deployed_outputs))
    settings.ROOT.set(None)
    set_all_config({k: v if isinstance(v, str) else json.dumps(v) for k, v in config.items()}, [])
    mocks.set_mocks(
        monitor.mocks,
        project=PROJECT,
        stack=stack,
        preview=False,
        monitor=monitor,
        organization=ORGANIZATION,
    )
    settings.SETTINGS.rpc_manager.clear()
    settings.SETTINGS.outputs.clear()

    # The program runs where `pulumi up` runs it, so a path that resolves only from elsewhere
    # fails here too.
    caller_dir = os.getcwd()
    os.chdir(PROGRAM_DIR)
    try:
        _sync_await(run_pulumi_func(program))
    finally:
        os.chdir(caller_dir)
    # set_mocks registers the root stack's outputs before the program runs, so read the exports
    # from the stack object itself.
    exports = settings.get_root_resource().outputs
    outputs = _sync_await(pulumi.Output.from_input(exports).future(with_unknowns=True))
    resources = sorted(monitor.recorded, key=lambda r: r.urn)
    return Plan(stack=stack, resources=resources, outputs=outputs or {}, region=region)
