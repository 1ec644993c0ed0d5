"""The local AWS endpoint (moto on 127.0.0.1, a fixture standing in for AWS): every moto
server in one process shares one backend, so each endpoint must start empty."""

from __future__ import annotations

import boto3

from gpupool.lab import localaws


def test_each_endpoint_starts_empty() -> None:
    with localaws.endpoint() as url:
        s3 = boto3.client("s3", region_name="us-east-1", endpoint_url=url)
        s3.create_bucket(Bucket="left-behind")
        assert [b["Name"] for b in s3.list_buckets()["Buckets"]] == ["left-behind"]
    with localaws.endpoint() as url:
        s3 = boto3.client("s3", region_name="us-east-1", endpoint_url=url)
        assert s3.list_buckets()["Buckets"] == []
