"""The rules behind pulumi_policy's analyzer server, as `pulumi preview --policy-pack` runs them.

The server (without its gRPC listener) gets requests the way the engine sends them: properties
as a protobuf Struct in which a value not known in a preview is pulumi's unknown sentinel.
"""

import json

from google.protobuf import json_format, struct_pb2
from pulumi.runtime import proto
from pulumi_policy import EnforcementLevel
from pulumi_policy.policy import _PolicyAnalyzerServicer
from pulumi_policy.proxy import UNKNOWN_STRING_VALUE

from policies.rules import POLICIES

MANDATORY = proto.MANDATORY


def server() -> _PolicyAnalyzerServicer:
    return _PolicyAnalyzerServicer(
        "training-platform", "0.0.1", POLICIES, EnforcementLevel.MANDATORY
    )


def analyze(resource_type: str, props: dict, stack: str = "dev") -> list:
    properties = struct_pb2.Struct()
    json_format.ParseDict(props, properties)
    request = proto.AnalyzeRequest(
        type=resource_type,
        properties=properties,
        urn=f"urn:pulumi:{stack}::training-platform::{resource_type}::r",
        name="r",
    )
    return list(server().Analyze(request, None).diagnostics)


def mandatory(diagnostics) -> set[str]:
    return {d.policyName for d in diagnostics if d.enforcementLevel == MANDATORY}


def test_a_policy_document_unknown_in_preview_fails_instead_of_passing():
    diagnostics = analyze("aws:iam/rolePolicy:RolePolicy", {"policy": UNKNOWN_STRING_VALUE})
    assert {"no-iam-star-on-star", "iam-no-service-wildcards"} <= mandatory(diagnostics)
    assert all("can't be known during preview" in d.message for d in diagnostics)


def test_known_documents_are_judged_on_their_content():
    scoped = {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::b/*"}
    good = {"policy": json.dumps({"Statement": [scoped]}), "role": UNKNOWN_STRING_VALUE}
    assert analyze("aws:iam/rolePolicy:RolePolicy", good) == []
    wild = {"policy": json.dumps({"Statement": [{**scoped, "Action": "s3:*"}]})}
    assert mandatory(analyze("aws:iam/rolePolicy:RolePolicy", wild)) == {"iam-no-service-wildcards"}


def test_split_world_ingress_fails_through_the_server():
    rule = {"type": "ingress", "cidrBlocks": ["0.0.0.0/1", "128.0.0.0/1"], "fromPort": 22}
    diagnostics = analyze("aws:ec2/securityGroupRule:SecurityGroupRule", rule)
    assert mandatory(diagnostics) == {"no-world-ingress"}


def test_stack_rules_run_over_the_engines_resource_list():
    bucket = proto.AnalyzerResource(
        type="aws:s3/bucketV2:BucketV2",
        properties=struct_pb2.Struct(),
        urn="urn:pulumi:prod::training-platform::aws:s3/bucketV2:BucketV2::b",
        name="b",
    )
    response = server().AnalyzeStack(proto.AnalyzeStackRequest(resources=[bucket]), None)
    assert "s3-private-and-tls-only" in mandatory(response.diagnostics)


def serve_plan(plan) -> set[tuple[str, str]]:
    """(rule, urn) of every mandatory diagnostic the server gives for a plan's resources."""
    analyzer = server()
    found = set()
    resources = []
    for r in plan.resources:
        properties = struct_pb2.Struct()
        json_format.ParseDict(json.loads(json.dumps(r.inputs)), properties)
        # The engine hands the options too: `protect` is what data-holders-protected reads.
        options = proto.AnalyzerResourceOptions(protect=r.protect)
        request = proto.AnalyzeRequest(
            type=r.type, properties=properties, urn=r.urn, name=r.name, options=options
        )
        found |= {(d.policyName, r.urn) for d in analyzer.Analyze(request, None).diagnostics}
        resources.append(
            proto.AnalyzerResource(
                type=r.type,
                properties=properties,
                urn=r.urn,
                name=r.name,
                options=options,
                parent=r.parent,
                dependencies=r.dependencies,
            )
        )
    stack = analyzer.AnalyzeStack(proto.AnalyzeStackRequest(resources=resources), None)
    return found | {(d.policyName, d.urn) for d in stack.diagnostics}


def test_server_and_offline_check_agree_on_the_stack_plans(stack_plan):
    from policies.offline import check

    assert serve_plan(stack_plan) == {(v.policy, v.urn) for v in check(stack_plan)} == set()


def test_server_and_offline_check_agree_on_a_broken_plan():
    from policies.offline import check
    from tests.plugin import plan_of

    split_world = {"endpoint": {"publicAccessCidrs": ["0.0.0.0/1", "128.0.0.0/1"]}}
    plan = plan_of("prod", cluster=split_world)
    found = serve_plan(plan)
    assert found == {(v.policy, v.urn) for v in check(plan)}
    assert {rule for rule, _ in found} == {"eks-endpoint-not-public-in-production"}
