"""Refresh a region's instance prices from the AWS Price List API (needs AWS credentials).

    python -m infra.core.catalog.refresh --region eu-west-1 [--region us-east-1 ...]

For every type in instance_types.yaml, asks GetProducts (AmazonEC2; Linux, shared tenancy, no
pre-installed software, on-demand) for the region's hourly USD price and rewrites the
`instancePrices` block of prices/<region>.yaml with today's date; types the region does not offer
are listed under `notOffered` (a pool naming one is then a config error there, saying so). The
other blocks are kept as they are; a new region's file starts with us-east-1's, every service price
labeled as copied (unverified in the plan) until checked by hand.

Without AWS credentials, or without access to the Price List API, it ends with one line saying
which, and exit status 2.
"""

import argparse
import datetime
import json
import sys
from pathlib import Path

import boto3
import botocore.exceptions
import yaml

from infra.core.catalog import COPIED, PRICES_DIR, load_catalog

SOURCE = "AWS Price List API GetProducts (AmazonEC2, Linux, Shared, no pre-installed SW, OnDemand)"
# The Price List API is served from us-east-1 (and a few others) whatever region is priced.
PRICING_ENDPOINT_REGION = "us-east-1"


def _filters(region: str, instance_type: str) -> list[dict[str, str]]:
    wanted = {
        "regionCode": region,
        "instanceType": instance_type,
        "operatingSystem": "Linux",
        "tenancy": "Shared",
        "preInstalledSw": "NA",
        "capacitystatus": "Used",
        "marketoption": "OnDemand",
    }
    return [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in wanted.items()]


def hourly_price(client, region: str, instance_type: str) -> float | None:
    """The on-demand USD/hour of one type in one region; None when the region does not offer it."""
    prices = []
    kwargs = {"ServiceCode": "AmazonEC2", "Filters": _filters(region, instance_type)}
    while True:
        page = client.get_products(**kwargs)
        for item in page["PriceList"]:
            product = json.loads(item)
            for term in product["terms"].get("OnDemand", {}).values():
                for dimension in term["priceDimensions"].values():
                    if dimension["unit"] == "Hrs":
                        prices.append(float(dimension["pricePerUnit"]["USD"]))
        if not page.get("NextToken"):
            break
        kwargs["NextToken"] = page["NextToken"]
    priced = [p for p in prices if p > 0]
    if len(set(priced)) > 1:
        raise ValueError(f"{instance_type} in {region}: several on-demand prices {sorted(priced)}")
    return priced[0] if priced else None


def refresh(
    region: str,
    client=None,
    types: list[str] | None = None,
    prices_dir: Path = PRICES_DIR,
    today: datetime.date | None = None,
) -> tuple[dict[str, float], list[str]]:
    """Rewrite prices/<region>.yaml's instancePrices; returns (prices, types not offered)."""
    client = client or boto3.client("pricing", region_name=PRICING_ENDPOINT_REGION)
    prices, missing = {}, []
    for name in types or load_catalog().names():
        price = hourly_price(client, region, name)
        if price is None:
            missing.append(name)
        else:
            prices[name] = price
    path = prices_dir / f"{region}.yaml"
    as_of = (today or datetime.date.today()).isoformat()
    if path.is_file():
        document = yaml.safe_load(path.read_text())
    else:
        document = yaml.safe_load((prices_dir / "us-east-1.yaml").read_text())
        document["region"] = region
        document["sources"][COPIED] = "COPIED FROM us-east-1 by refresh: check by hand"
        for entry in [*document["servicePrices"].values()]:
            entry["source"] = COPIED
        document["spotPrices"]["usdPerHour"] = {}
        document["capacityBlockPrices"] = {}
    not_offered = {
        name: reason
        for name, reason in (document["instancePrices"].get("notOffered") or {}).items()
        if name not in prices
    }
    not_offered |= {
        name: f"no On-Demand price in the AWS Price List API ({as_of})" for name in missing
    }
    document["instancePrices"] = {
        "source": SOURCE,
        "asOf": as_of,
        "usdPerHour": prices,
        "notOffered": not_offered,
    }
    header = f"# {region}: instancePrices written by python -m infra.core.catalog.refresh.\n"
    path.write_text(header + yaml.safe_dump(document, sort_keys=False, width=100))
    return prices, missing


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m infra.core.catalog.refresh", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--region",
        action="append",
        required=True,
        help="a region to refresh, e.g. eu-west-1 (repeatable; writes "
        "infra/core/catalog/prices/<region>.yaml)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    for region in args.region:
        try:
            prices, missing = refresh(region)
        except botocore.exceptions.NoCredentialsError:
            print(
                "error: no AWS credentials found (set AWS_PROFILE or AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY); the Price List API needs pricing:GetProducts",
                file=sys.stderr,
            )
            return 2
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:
            print(
                f"error: the AWS Price List API refused or could not be reached: {e}",
                file=sys.stderr,
            )
            return 2
        print(f"{region}: {len(prices)} types priced -> {PRICES_DIR / (region + '.yaml')}")
        if missing:
            print(f"  not offered in {region}: {', '.join(missing)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
