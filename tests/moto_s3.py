"""moto's S3 in server mode on 127.0.0.1, for code that talks to S3 the way it does on AWS.

s3torchconnector (the trainer's DCP reader and writer) and TensorBoard's boto3 file system reach
it through AWS_ENDPOINT_URL; moto's in-process mock_aws would intercept only botocore's calls."""

import contextlib
import subprocess
import sys
import tempfile

import boto3

# moto's server on a port the system picks as it binds (no window in which another process can
# take a port chosen before), which it prints once it listens.
SERVE = """
import threading
from moto.moto_server.threaded_moto_server import ThreadedMotoServer
server = ThreadedMotoServer("127.0.0.1", 0, verbose=False)
server.start()
print(server.get_host_and_port()[1], flush=True)
threading.Event().wait()
"""


@contextlib.contextmanager
def moto_server():
    """The environment that points AWS clients at a fresh moto server (its credentials are
    moto's test ones); the server stops on the way out."""
    log = tempfile.TemporaryFile()  # werkzeug logs every request: a pipe nobody read would fill
    server = subprocess.Popen(
        [sys.executable, "-c", SERVE], stdout=subprocess.PIPE, stderr=log, text=True
    )
    try:
        port = server.stdout.readline().strip()
        if not port:
            log.seek(0)
            raise AssertionError(f"moto server did not start: {log.read()[-2000:].decode()}")
        yield {
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
        }
    finally:
        server.terminate()
        server.wait(timeout=10)
        log.close()


def s3_client(env: dict):
    """A boto3 S3 client of the server `env` points at."""
    return boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        region_name=env["AWS_REGION"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
    )
