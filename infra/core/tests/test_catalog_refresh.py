"""The price refresh against recorded-shape GetProducts answers (moto has no Pricing API)."""

import datetime
import json
import shutil

import boto3
import pytest
import yaml
from botocore.stub import Stubber

from infra.core.catalog import COPIED, PRICES_DIR
from infra.core.catalog.refresh import _filters, refresh


def product(instance_type: str, region: str, usd: str) -> str:
    """One PriceList entry as GetProducts returns it (a JSON string per product)."""
    sku, term = "SKU" + instance_type.upper().replace(".", ""), "JRTCKXETXF"
    return json.dumps(
        {
            "product": {
                "productFamily": "Compute Instance",
                "attributes": {
                    "instanceType": instance_type,
                    "regionCode": region,
                    "operatingSystem": "Linux",
                    "tenancy": "Shared",
                    "preInstalledSw": "NA",
                    "capacitystatus": "Used",
                    "marketoption": "OnDemand",
                    "servicecode": "AmazonEC2",
                    "usagetype": f"EU-BoxUsage:{instance_type}",
                    "operation": "RunInstances",
                },
                "sku": sku,
            },
            "serviceCode": "AmazonEC2",
            "terms": {
                "OnDemand": {
                    f"{sku}.{term}": {
                        "priceDimensions": {
                            f"{sku}.{term}.6YS6EN2CT7": {
                                "unit": "Hrs",
                                "endRange": "Inf",
                                "description": f"${usd} per On Demand Linux {instance_type} "
                                "Instance Hour",
                                "appliesTo": [],
                                "rateCode": f"{sku}.{term}.6YS6EN2CT7",
                                "beginRange": "0",
                                "pricePerUnit": {"USD": usd},
                            }
                        },
                        "sku": sku,
                        "effectiveDate": "2026-11-01T00:00:00Z",
                        "offerTermCode": term,
                        "termAttributes": {},
                    }
                }
            },
            "version": "20261101000000",
            "publicationDate": "2026-11-01T00:00:00Z",
        }
    )


@pytest.fixture
def pricing():
    client = boto3.client(
        "pricing", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
    )
    with Stubber(client) as stubber:
        yield client, stubber
        stubber.assert_no_pending_responses()


def expect(stubber, region, instance_type, price_list, next_token=None, token=None):
    params = {"ServiceCode": "AmazonEC2", "Filters": _filters(region, instance_type)}
    if token:
        params["NextToken"] = token
    response = {"FormatVersion": "aws_v1", "PriceList": price_list}
    if next_token:
        response["NextToken"] = next_token
    stubber.add_response("get_products", response, params)


def test_refresh_rewrites_instance_prices_keeps_service_prices(tmp_path, pricing):
    client, stubber = pricing
    shutil.copy(PRICES_DIR / "eu-west-1.yaml", tmp_path)
    shutil.copy(PRICES_DIR / "us-east-1.yaml", tmp_path)
    expect(stubber, "eu-west-1", "m6i.large", [], next_token="page2")
    answer = [product("m6i.large", "eu-west-1", "0.1070000000")]
    expect(stubber, "eu-west-1", "m6i.large", answer, token="page2")
    expect(stubber, "eu-west-1", "p5.48xlarge", [])  # not offered there
    prices, missing = refresh(
        "eu-west-1",
        client,
        ["m6i.large", "p5.48xlarge"],
        tmp_path,
        datetime.date(2026, 11, 22),
    )
    assert (prices, missing) == ({"m6i.large": 0.107}, ["p5.48xlarge"])
    text = (tmp_path / "eu-west-1.yaml").read_text()
    written = yaml.safe_load(text)
    assert written["instancePrices"]["usdPerHour"] == {"m6i.large": 0.107}
    # Not offered: said so, with the refresh's date; the file's other refusals are kept.
    not_offered = written["instancePrices"]["notOffered"]
    assert not_offered["p5.48xlarge"] == "no On-Demand price in the AWS Price List API (2026-11-22)"
    assert not_offered["p5en.48xlarge"].startswith("not sold in eu-west-1")
    assert "asOf: '2026-11-22'" in text and "AWS Price List API GetProducts" in text
    before = yaml.safe_load((PRICES_DIR / "eu-west-1.yaml").read_text())
    assert written["servicePrices"] == before["servicePrices"]  # untouched


def test_refresh_of_a_new_region_labels_the_copied_service_prices(tmp_path, pricing):
    client, stubber = pricing
    shutil.copy(PRICES_DIR / "us-east-1.yaml", tmp_path)
    answer = [product("m6i.large", "ap-northeast-1", "0.1240000000")]
    expect(stubber, "ap-northeast-1", "m6i.large", answer)
    refresh("ap-northeast-1", client, ["m6i.large"], tmp_path, datetime.date(2026, 11, 22))
    text = (tmp_path / "ap-northeast-1.yaml").read_text()
    assert "region: ap-northeast-1" in text and "m6i.large: 0.124" in text
    assert "COPIED FROM us-east-1 by refresh: check by hand" in text
    # Every copied service price is marked so: the plan lists each as unverified.
    written = yaml.safe_load(text)
    assert {e["source"] for e in written["servicePrices"].values()} == {COPIED}
