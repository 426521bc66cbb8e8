"""What EKS support a cluster's Kubernetes version is in on a day, what it costs, and what the plan
warns of ahead: the dates are infra/core/versions.py's (EKS's Kubernetes release calendar).

In standard support the control plane bills the standard rate. After it, EKS's upgrade policy
decides (EKS user guide, "Cluster upgrade policy"): EXTENDED (the API's default) keeps the version
and bills the extended rate until extended support ends, when EKS upgrades the control plane
itself; STANDARD has EKS upgrade it to the next version the day standard support ends.
"""

import datetime
import os
from dataclasses import dataclass

import infra.eks.config as cluster_config
from infra.core.config import ConfigError
from infra.core.versions import KUBERNETES_VERSIONS

# How long ahead of the end of standard support the plan warns.
WARN_AHEAD = datetime.timedelta(days=90)
# The day the plan prices and warns for, when not today (UTC): `make plan AS_OF=2027-04-01`
# shows the bill after a version leaves standard support; the test suite pins it, so that its
# figures do not change with the calendar.
PLAN_DAY_VARIABLE = "TRAINING_PLATFORM_PLAN_DAY"


def plan_day() -> datetime.date:
    value = os.environ.get(PLAN_DAY_VARIABLE)
    if not value:
        return cluster_config.utc_today()
    try:
        return datetime.date.fromisoformat(value)
    except ValueError:
        raise ConfigError(
            f"plan day {value!r} (--as-of, {PLAN_DAY_VARIABLE}) is not a day; allowed: "
            "YYYY-MM-DD, or none for today (UTC)"
        ) from None


@dataclass(frozen=True)
class Support:
    tier: str  # "standard" or "extended": what the control plane bills on the day
    detail: str  # for the cost line
    warning: str | None  # what the platform engineer must decide, and by when


def support_on(version: str, policy: str, day: datetime.date | None = None) -> Support:
    day = day or plan_day()
    known = KUBERNETES_VERSIONS.get(version)
    if known is None:
        return Support("standard", f"Kubernetes {version}: no support dates known", None)
    standard, extended = known.standard_support_ends, known.extended_support_ends
    upgrade = "upgrade the cluster (docs: day two, upgrades)"
    if day < standard:
        warning = None
        if day >= standard - WARN_AHEAD:
            days = (standard - day).days
            then = (
                "the control plane bills extended support from then on"
                if policy == "EXTENDED"
                else "EKS upgrades the control plane itself that day, ahead of the stack"
            )
            warning = (
                f"Kubernetes {version} leaves EKS standard support on {standard} (in {days} "
                f"days): with cluster.upgradePolicy {policy}, {then}; {upgrade} before then"
            )
        return Support("standard", f"standard support until {standard}", warning)
    if policy == "STANDARD" or day >= extended:
        ended = standard if policy == "STANDARD" else extended
        return Support(
            "standard",
            f"Kubernetes {version} left support on {ended}",
            f"Kubernetes {version} is past its support ({standard}): EKS upgrades the control "
            f"plane itself; set cluster.kubernetesVersion to the next version and {upgrade}",
        )
    return Support(
        "extended",
        f"extended support since {standard}, until {extended}",
        f"Kubernetes {version} is in EKS extended support since {standard} (upgradePolicy "
        f"EXTENDED): the control plane bills the extended rate; {upgrade}",
    )
