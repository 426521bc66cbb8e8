"""moto's S3 in server mode on 127.0.0.1, for code that talks to S3 the way it does on AWS.

s3torchconnector (the trainer's DCP reader and writer) and TensorBoard's boto3 file system reach
it through AWS_ENDPOINT_URL; moto's in-process mock_aws would intercept only botocore's calls."""

import contextlib
import socket
import subprocess
import sys
import time

import boto3


@contextlib.contextmanager
def moto_server():
    """The environment that points AWS clients at a fresh moto server (its credentials are
    moto's test ones); the server stops on the way out."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    env = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    deadline = time.monotonic() + 30
    try:
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "moto server did not start"
                time.sleep(0.1)
        yield env
    finally:
        server.terminate()
        server.wait(timeout=10)


def s3_client(env: dict):
    """A boto3 S3 client of the server `env` points at."""
    return boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        region_name=env["AWS_REGION"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
    )
