"""What `make plan` says changed, and the prices it uses: per region, sourced, or refused."""

import shutil
import subprocess

import pytest
import yaml

from deploy.plan import CHANGES_FILE, main, tree_at
from deploy.plan_changes import changes, plan_facts
from deploy.program import build_platform
from deploy.program import main as program_main
from infra.core.catalog import load_prices, supported_regions
from infra.core.config import ConfigError
from infra.core.offline import run_offline
from infra.stack.loading import (
    config_from_pulumi,
    load_stack_file,
    parse_stack_config,
    read_stack_file,
)
from infra.stack.policy import _placeholder as placeholder_reason
from infra.stack.policy import placeholder_errors
from tests.plugin import ROOT, plan_of, stack_values

MAX_NODES_4_TO_12 = [
    "NodePool gpu-small limits.cpu 192 -> 576",
    "NodePool gpu-small limits.memory 768Gi -> 2304Gi",
    "NodePool gpu-small limits.nodes 4 -> 12",
    "NodePool gpu-small limits.nvidia.com/gpu 16 -> 48",
    "NodePool gpu-small max $/hour 22.78 -> 68.33",
    "ClusterQueue platform quota.gpu-small.cpu 192 -> 576",
    "ClusterQueue platform quota.gpu-small.memory 768Gi -> 2304Gi",
    "ClusterQueue platform quota.gpu-small.nvidia.com/gpu 16 -> 48",
    "ClusterQueue team-research borrowing.gpu-small.cpu 96 -> 288",
    "ClusterQueue team-research borrowing.gpu-small.memory 384Gi -> 1152Gi",
    "ClusterQueue team-research borrowing.gpu-small.nvidia.com/gpu 8 -> 24",
    "Cost NodePools max $/hour 382.498 -> 428.050",
    "Cost ceiling $/hour 383.119 -> 428.670",
]


def write_stack(folder, stack="dev", **sections):
    values = stack_values("dev", **sections)
    (folder / f"Pulumi.{stack}.yaml").write_text(yaml.safe_dump({"config": values}))


def with_gpu_small_max_nodes(n: int) -> list[dict]:
    pools = stack_values("dev")["training-platform:nodePools"]
    return [{**p, "maxNodes": n} if p["name"] == "gpu-small" else p for p in pools]


def test_max_nodes_edit_against_the_previous_plan_lists_exactly_what_moves(tmp_path, capsys):
    out = tmp_path / "build/plan/dev"
    shutil.copy(ROOT / "Pulumi.dev.yaml", tmp_path)
    assert main(["--stack", "dev", "--project-dir", str(tmp_path), "--out", str(out)]) == 0
    assert (out / CHANGES_FILE).read_text() == f"no earlier plan in {out}/base to compare with\n"
    write_stack(tmp_path, nodePools=with_gpu_small_max_nodes(12))
    capsys.readouterr()
    assert main(["--stack", "dev", "--project-dir", str(tmp_path), "--out", str(out)]) == 0
    assert (out / CHANGES_FILE).read_text().splitlines() == MAX_NODES_4_TO_12
    printed = capsys.readouterr().out
    assert f"Changes against the plan in {out}/base:\n  NodePool gpu-small limits.cpu" in printed
    # Planning again with nothing edited: nothing changed.
    assert main(["--stack", "dev", "--project-dir", str(tmp_path), "--out", str(out)]) == 0
    assert (out / CHANGES_FILE).read_text() == "no change\n"


def test_a_steep_cost_rise_needs_the_budget_set_in_the_same_change(tmp_path, capsys):
    """Without policy.budgetUsdPerHour the budget follows the plan before: gpu-small's maxNodes
    12 -> 40 passed the default $1,000/hour before. (4 -> 12, 12 % up, is an ordinary edit:
    test_max_nodes_edit_against_the_previous_plan_lists_exactly_what_moves.)"""
    out = tmp_path / "build/plan/dev"
    args = ["--stack", "dev", "--project-dir", str(tmp_path), "--out", str(out)]
    write_stack(tmp_path, nodePools=with_gpu_small_max_nodes(12))
    assert main(args) == 0
    write_stack(tmp_path, nodePools=with_gpu_small_max_nodes(40))
    capsys.readouterr()
    assert main(args) == 1
    assert (
        "  [mandatory] cost-budget: the cost ceiling rises from $428.67 to $588.10/hour "
        "against the plan before (x1.4), more than 25%, and the stack file sets no "
        "policy.budgetUsdPerHour; allowed: a smaller rise, or policy.budgetUsdPerHour set in "
        "this change (at least 589)"
    ) in capsys.readouterr().out.splitlines()
    budgeted = {"budgetUsdPerHour": 600}
    write_stack(tmp_path, nodePools=with_gpu_small_max_nodes(40), policy=budgeted)
    assert main(args) == 0


def test_against_a_git_ref_plans_the_stack_file_as_it_was_there(tmp_path, capsys):
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    shutil.copy(ROOT / "Pulumi.dev.yaml", tmp_path)
    git("add", "Pulumi.dev.yaml")
    git("-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "base")
    write_stack(tmp_path, nodePools=with_gpu_small_max_nodes(12))
    args = ["--stack", "dev", "--project-dir", str(tmp_path), "--out", str(tmp_path / "out")]
    assert main([*args, "--against-ref", "HEAD"]) == 0
    assert (tmp_path / "out" / CHANGES_FILE).read_text().splitlines() == MAX_NODES_4_TO_12
    printed = capsys.readouterr().out
    assert "Changes against Pulumi.dev.yaml at HEAD (planned by this checkout's code):" in printed
    assert main([*args, "--against-ref", "no-such-ref"]) == 2
    assert "--against-ref: 'no-such-ref' is not a commit" in capsys.readouterr().err
    # A stack the ref does not have yet: every fact is new.
    (tmp_path / "Pulumi.dev.yaml").rename(tmp_path / "Pulumi.fresh.yaml")
    fresh = ["--stack", "fresh", "--project-dir", str(tmp_path), "--out", str(tmp_path / "f")]
    assert main([*fresh, "--against-ref", "HEAD"]) == 0
    lines = (tmp_path / "f" / CHANGES_FILE).read_text().splitlines()
    assert "NodePool gpu-small limits.nodes - -> 12" in lines
    assert all(" - -> " in line for line in lines)


def test_a_ref_is_planned_from_files_with_the_modes_of_a_checkout(tmp_path):
    """Modes are part of every image's tag: the ref's files must not differ from a checkout's."""
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    subprocess.run(["git", "-C", str(checkout), "init", "-q"], check=True)
    for name, mode in (("train.py", 0o644), ("entrypoint.sh", 0o755)):
        (checkout / name).write_text("x\n")
        (checkout / name).chmod(mode)
    subprocess.run(["git", "-C", str(checkout), "add", "."], check=True)
    subprocess.run(
        ["git", "-C", str(checkout), "-c", "user.name=t", "-c", "user.email=t@example.com"]
        + ["commit", "-qm", "base"],
        check=True,
    )
    tree_at("HEAD", checkout, tmp_path / "tree")
    for name in ("train.py", "entrypoint.sh"):
        assert (tmp_path / "tree" / name).stat().st_mode == (checkout / name).stat().st_mode


@pytest.mark.parametrize("region", ["us-east-1", "us-west-2", "eu-west-1", "eu-central-1"])
def test_each_supported_region_has_dated_sourced_prices(region):
    prices = load_prices(region)
    assert prices.instance_source and prices.spot_source
    assert prices.instance_as_of[:4] in {"2025", "2026"}
    assert prices.instance("m6i.large") > 0 and prices.instance("g4dn.xlarge") > 0
    assert prices.usd("eksStandardSupportPerHour") == 0.10
    # Every service price names a source that says where and when it was read.
    for price in prices.services.values():
        key, text = price.source.split(": ", 1)
        assert key and len(text) > 20, price


def test_prices_follow_the_region_in_plan_and_config():
    east, ireland, frankfurt = (load_prices(r) for r in ("us-east-1", "eu-west-1", "eu-central-1"))
    assert east.instance("g5.12xlarge") == 5.672 and ireland.instance("g5.12xlarge") == 6.33167
    assert east.usd("natGatewayPerHour") == 0.045 and frankfurt.usd("natGatewayPerHour") == 0.052
    assert supported_regions() == ["eu-central-1", "eu-west-1", "us-east-1", "us-west-2"]


def with_gpu_large_types(types: list[str]) -> list[dict]:
    pools = stack_values("dev")["training-platform:nodePools"]
    return [{**p, "instanceTypes": types} if p["name"] == "gpu-large" else p for p in pools]


@pytest.mark.parametrize(
    ("region", "instance_type", "message"),
    [
        (
            "ap-northeast-1",
            "p4d.24xlarge",
            "aws:region: no prices for region 'ap-northeast-1' in infra/core/catalog/prices/; "
            "supported regions: eu-central-1, eu-west-1, us-east-1, us-west-2",
        ),
        (
            "eu-west-1",  # AWS sells no p5 in Ireland
            "p5.48xlarge",
            "training-platform:nodePools[gpu-large].instanceTypes[0]: p5.48xlarge is not offered "
            "in eu-west-1: not sold in eu-west-1",
        ),
        (
            "us-west-2",  # nor p5e On-Demand anywhere
            "p5e.48xlarge",
            "training-platform:nodePools[gpu-large].instanceTypes[0]: p5e.48xlarge is not offered "
            "in us-west-2: no On-Demand price in any region",
        ),
        (
            "eu-west-1",  # sold there, but its price not read yet
            "g6.48xlarge",
            "training-platform:nodePools[gpu-large].instanceTypes[0]: g6.48xlarge has no "
            "eu-west-1 price in infra/core/catalog/prices/eu-west-1.yaml",
        ),
    ],
)
def test_a_region_or_type_without_a_price_is_a_config_error_naming_the_key(
    tmp_path, region, instance_type, message
):
    pools = with_gpu_large_types([instance_type])
    values = {**stack_values("dev", nodePools=pools), "aws:region": region}
    (tmp_path / "Pulumi.moved.yaml").write_text(yaml.safe_dump({"config": values}))
    with pytest.raises(ConfigError) as refused:
        load_stack_file("moved", tmp_path)
    assert message in str(refused.value)


def test_moving_the_stack_to_another_region_reprices_it():
    oregon = plan_of("dev")
    pools = [
        {**p, "availabilityZone": "eu-central-1a"} if p.get("efa") else p
        for p in stack_values("dev")["training-platform:nodePools"]
    ]
    values = {**stack_values("dev", nodePools=pools), "aws:region": "eu-central-1"}
    frankfurt_config = parse_stack_config(values, "Pulumi.dev.yaml")
    frankfurt = run_offline(lambda: build_platform(frankfurt_config), "dev", values)
    lines = changes(
        plan_facts(load_stack_file("dev"), oregon), plan_facts(frankfurt_config, frankfurt)
    )
    # Nodes with their gp3 disks: 200 GiB (GPU pools), 100 at 600 MiB/s (cpu), 50 (system) at
    # $0.0952/GiB-month and $0.048/MiB/s-month above 125 in Frankfurt.
    assert lines == [
        "NodePool cpu max $/hour 8.05 -> 9.64",  # 10 x (m6i.4xlarge $0.92 + 100 GiB, 475 MiB/s)
        "NodePool gpu-large max $/hour 351.67 -> 439.34",  # 16 x (p4d.24xlarge $27.43298 + ...)
        "NodePool gpu-small max $/hour 22.78 -> 28.48",  # 4 x (g5.12xlarge $7.09282 + ...)
        "Cost region us-west-2 -> eu-central-1",
        "Cost NAT gateway network-0 $/hour 0.045 -> 0.052",
        "Cost node group cluster-system $/hour 0.203 -> 0.243",  # 2 x (m6i.large $0.115 + ...)
        "Cost node group cluster-system to maxSize $/hour 0.101 -> 0.122",  # maxSize 3: 1 more
        "Cost storage quota dev-alice/devservers $/hour 0.110 -> 0.130",  # 1000 GiB of homes
        "Cost storage quota dev-bob/devservers $/hour 0.055 -> 0.065",  # 500 GiB
        "Cost floor $/hour 0.354 -> 0.401",
        # No spot figure in Frankfurt's file: the jobs' nodes at On-Demand.
        "Cost expected $/hour 67.931 -> 84.804",
        "Cost NodePools max $/hour 382.498 -> 477.463",
        "Cost ceiling $/hour 383.119 -> 478.182",
    ]


DOCUMENTATION_ACCOUNT = "is in AWS's documentation account 123456789012; allowed: your own account"
RFC_5737 = "is a documentation range (RFC 5737); allowed: your own CIDRs"
RFC_2606 = "is in a documentation domain (RFC 2606); allowed: a real address"


def test_every_placeholder_of_either_stack_is_listed_for_the_engine_to_refuse():
    """Every documentation value the stack files ship, wherever it sits: ranges, ARNs of AWS's
    example account, addresses at example domains."""
    key = "training-platform:"
    sso = "aws-reserved/sso.amazonaws.com/us-west-2/AWSReservedSSO_MLEngineer_0123456789abcdef"
    assert placeholder_errors(load_stack_file("dev")) == [
        f"{key}cluster.adminPrincipalArns[0]: arn:aws:iam::123456789012:role/platform-admins "
        f"{DOCUMENTATION_ACCOUNT}",
        f"{key}queues.teams[team-a].members[0]: arn:aws:iam::123456789012:role/{sso} "
        f"{DOCUMENTATION_ACCOUNT}",
        f"{key}queues.teams[team-a].members[1]: arn:aws:iam::123456789012:role/dev-alice "
        f"{DOCUMENTATION_ACCOUNT}",
        f"{key}queues.teams[research].members[0]: arn:aws:iam::123456789012:role/research-ml "
        f"{DOCUMENTATION_ACCOUNT}",
        f"{key}devServers.users[alice].email: alice@example.com {RFC_2606}",
        f"{key}devServers.users[alice].iamPrincipalArn: arn:aws:iam::123456789012:role/dev-alice "
        f"{DOCUMENTATION_ACCOUNT}",
        f"{key}devServers.users[bob].email: bob@example.com {RFC_2606}",
        f"{key}devServers.users[bob].iamPrincipalArn: arn:aws:iam::123456789012:user/bob "
        f"{DOCUMENTATION_ACCOUNT}",
    ]
    assert placeholder_errors(load_stack_file("prod")) == [
        f"{key}cluster.endpoint.publicAccessCidrs[0]: 203.0.113.0/24 {RFC_5737}",
        f"{key}cluster.endpoint.publicAccessCidrs[1]: 198.51.100.0/24 {RFC_5737}",
        f"{key}cluster.adminPrincipalArns[0]: arn:aws:iam::123456789012:role/platform-admins "
        f"{DOCUMENTATION_ACCOUNT}",
        f"{key}devServers.users[carol].email: carol@example.com {RFC_2606}",
        f"{key}devServers.users[carol].iamPrincipalArn: arn:aws:iam::123456789012:role/dev-carol "
        f"{DOCUMENTATION_ACCOUNT}",
        f"{key}devServers.sshLoadBalancerCidrs[0]: 203.0.113.0/24 {RFC_5737}",
    ]


CN_ARN = "arn:aws-cn:iam::123456789012:user/x"
OTHER_ARN = "arn:aws:iam::123456789013:user/x"
ECR = "dkr.ecr.us-west-2.amazonaws.com/team-images"
DIGEST = "sha256:" + "0" * 64


def arn(account: str) -> dict:
    return {"cluster": {"adminPrincipalArns": [f"arn:aws:iam::{account}:role/admins"]}}


def registry(value: str) -> dict:
    return {"devServers": {"allowedImageRegistries": [value]}}


@pytest.mark.parametrize(
    "section, value, listed",
    [
        (
            {"cluster": {"endpoint": {"publicAccessCidrs": ["192.0.2.128/25"]}}},
            "192.0.2.128/25",
            True,
        ),
        ({"cluster": {"endpoint": {"publicAccessCidrs": ["192.0.3.0/24"]}}}, "192.0.3.0/24", False),
        ({"devServers": {"sshLoadBalancerCidrs": ["198.51.100.7/32"]}}, "198.51.100.7/32", True),
        ({"image": {"uri": f"203.0.113.9:5000/trainer@{DIGEST}"}}, "203.0.113.9:5000", True),
        ({"image": {"uri": f"203.0.114.9:5000/trainer@{DIGEST}"}}, "203.0.114.9:5000", False),
        ({"cluster": {"adminPrincipalArns": [CN_ARN]}}, CN_ARN, True),
        ({"cluster": {"adminPrincipalArns": [OTHER_ARN]}}, OTHER_ARN, False),
        (arn("111122223333"), "111122223333", True),
        (arn("444455556666"), "444455556666", True),
        (arn("777788889999"), "777788889999", True),
        (arn("012345678901"), "012345678901", True),
        (arn("987654321098"), "987654321098", True),
        (registry(f"1111222233334.{ECR}"), "1111222233334.dkr", False),
        (registry(f"123456789012.{ECR}"), "123456789012.dkr", True),
        (registry(f"210987654321.{ECR}"), "210987654321.dkr", False),
        (registry("registry.example.com"), "registry.example.com", True),
        (registry("example.org/team"), "example.org/team", True),
        (registry("images.internal.test"), "images.internal.test", True),
        (registry("mirror.invalid:5000"), "mirror.invalid", True),
        (registry("docs.example/images"), "docs.example", True),
        (registry("registry.example.com.au"), "registry.example.com.au", False),
        (registry("notexample.com"), "notexample.com", False),
        (registry("test.acme.io"), "test.acme.io", False),
        (registry("ghcr.io/example"), "ghcr.io/example", False),
    ],
)
def test_a_placeholder_anywhere_is_listed_and_nothing_else(section, value, listed):
    """A documentation range, account or domain anywhere in any value, and none of their
    neighbours."""
    values = stack_values("dev", **section)
    found = [line for line in placeholder_errors(parse_stack_config(values, "t")) if value in line]
    assert bool(found) == listed


@pytest.mark.parametrize(
    "value, listed",
    [
        ("[2001:db8::7]:5000", True),
        ("2001:0db8:0:1::/64", True),
        ("[3fff:0:1::7]:5000", True),
        ("[2001:db9::7]:5000", False),
        ("sha256:2001:db8", False),
    ],
)
def test_a_documentation_ipv6_range_in_a_value_is_a_placeholder(value, listed):
    """No key takes an IPv6 address yet; a value that names one of the documentation ranges
    (RFC 3849, RFC 9637) is caught the day one does."""
    assert bool(placeholder_reason(value)) == listed


def test_a_user_at_a_real_domain_is_no_placeholder():
    users = stack_values("dev")["training-platform:devServers"]["users"]
    real = [{**u, "email": f"{u['name']}@notexample.com"} for u in users]
    config = parse_stack_config(stack_values("dev", devServers={"users": real}), "t")
    assert not any("email" in line for line in placeholder_errors(config))


# Real values in place of every documentation value the stack files ship.
REAL_VALUES = {
    "123456789012": "210987654321",
    "@example.com": "@acme.io",
    "203.0.113.0/24": "81.2.69.0/24",
    "198.51.100.0/24": "81.2.70.0/24",
}


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_the_real_program_entry_refuses_placeholders_until_replaced(stack, tmp_path):
    """`pulumi preview`/`up` run the program's main, which refuses any stack with placeholders;
    with every one replaced, the same stack file passes. The offline plan plans them as they are."""
    with pytest.raises(ConfigError) as refused:
        run_offline(program_main, stack, read_stack_file(stack))
    assert f"Pulumi.{stack}.yaml: placeholders left in" in str(refused.value)
    text = (ROOT / f"Pulumi.{stack}.yaml").read_text()
    for placeholder, real in REAL_VALUES.items():
        text = text.replace(placeholder, real)
    (tmp_path / f"Pulumi.{stack}.yaml").write_text(text)
    seen = []
    run_offline(lambda: seen.append(config_from_pulumi()), stack, read_stack_file(stack, tmp_path))
    assert seen[0].cluster.admin_principal_arns == [
        "arn:aws:iam::210987654321:role/platform-admins"
    ]
