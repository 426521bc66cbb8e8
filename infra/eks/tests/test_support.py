"""EKS version support: the control plane priced by the tier it is in on the plan's day, the
upgrade policy's choice and cost shown, and a warning ahead of the end of standard support."""

import datetime

import pytest

from deploy.plan import main, summary
from infra.core.versions import KUBERNETES_VERSIONS
from infra.eks.support import PLAN_DAY_VARIABLE, support_on
from infra.integrations import plan_cost
from infra.stack.loading import parse_stack_config
from tests.plugin import SUITE_PLAN_DAY, plan_of, stack_values

OLD = {"kubernetesVersion": "1.34", "upgradePolicy": "EXTENDED"}


def on(monkeypatch, day: str) -> None:
    monkeypatch.setenv(PLAN_DAY_VARIABLE, day)


def control_plane(plan):
    (line,) = [line for line in plan_cost("us-west-2", plan).lines if "control plane" in line.item]
    return line


def test_a_stack_at_1_34_after_2026_12_02_pays_extended_support(monkeypatch):
    on(monkeypatch, "2026-12-03")
    line = control_plane(plan_of("dev", cluster=OLD))
    assert (line.usd_per_hour, line.detail) == (
        0.60,
        "extended support since 2026-12-02, until 2027-12-02",
    )
    on(monkeypatch, "2026-12-01")
    line = control_plane(plan_of("dev", cluster=OLD))
    assert (line.usd_per_hour, line.detail) == (0.10, "standard support until 2026-12-02")


def test_the_upgrade_policy_choice_and_its_cost_are_shown_with_a_warning_ahead(monkeypatch):
    on(monkeypatch, "2026-11-26")
    values = stack_values("dev", cluster=OLD)
    config = parse_stack_config(values, "Pulumi.dev.yaml")
    text = summary(config, plan_of("dev", cluster=OLD))
    assert (
        "Kubernetes 1.34 on EKS: standard support until 2026-12-02; at its end (2026-12-02) "
        "upgradePolicy EXTENDED keeps it at $0.60/h instead of $0.10/h (+$365/month, until "
        "2027-12-02), STANDARD has EKS upgrade it; this stack: EXTENDED" in text
    )
    assert (
        "  WARNING: Kubernetes 1.34 leaves EKS standard support on 2026-12-02 (in 6 days): with "
        "cluster.upgradePolicy EXTENDED, the control plane bills extended support from then on"
    ) in text
    # The default version is far from its end: no warning.
    assert "WARNING: Kubernetes" not in summary(
        parse_stack_config(stack_values("dev"), "Pulumi.dev.yaml"), plan_of("dev")
    )


@pytest.mark.parametrize(
    ("day", "policy", "tier"),
    [
        ("2026-12-03", "STANDARD", "standard"),  # EKS upgraded it: no extended bill
        ("2027-12-03", "EXTENDED", "standard"),  # extended support over: EKS upgraded it too
        ("2027-06-01", "EXTENDED", "extended"),
    ],
)
def test_after_standard_support_the_policy_decides(day, policy, tier):
    support = support_on("1.34", policy, datetime.date.fromisoformat(day))
    assert support.tier == tier and support.warning


def test_as_of_plans_a_later_day_and_refuses_what_is_not_a_day(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv(PLAN_DAY_VARIABLE, SUITE_PLAN_DAY)  # main() sets it: restored after
    assert main(["--stack", "dev", "--out", str(tmp_path), "--as-of", "2027-04-01"]) == 0
    out = capsys.readouterr().out
    assert "Kubernetes 1.35 on EKS: extended support since 2027-03-27, until 2028-03-27" in out
    assert "  WARNING: Kubernetes 1.35 is in EKS extended support since 2027-03-27" in out
    assert main(["--stack", "dev", "--out", str(tmp_path), "--as-of", "April"]) == 2
    assert capsys.readouterr().err == (
        "error: plan day 'April' (--as-of, TRAINING_PLATFORM_PLAN_DAY) is not a day; allowed: "
        "YYYY-MM-DD, or none for today (UTC)\n"
    )


@pytest.mark.parametrize("version", ["1.35", "1.36", "1.37"])
def test_each_supported_version_is_priced_by_its_own_support_dates(monkeypatch, version):
    """Standard support until its own end, then extended (EXTENDED, the default) until its
    extended end: the control plane's cost line follows the version's dates."""
    known = KUBERNETES_VERSIONS[version]
    cluster = {"kubernetesVersion": version}
    on(monkeypatch, known.standard_support_ends.isoformat())
    line = control_plane(plan_of("dev", cluster=cluster))
    assert (line.usd_per_hour, line.detail) == (
        0.60,
        f"extended support since {known.standard_support_ends}, "
        f"until {known.extended_support_ends}",
    )
    day_before = known.standard_support_ends - datetime.timedelta(days=1)
    on(monkeypatch, day_before.isoformat())
    line = control_plane(plan_of("dev", cluster=cluster))
    assert (line.usd_per_hour, line.detail) == (
        0.10,
        f"standard support until {known.standard_support_ends}",
    )
