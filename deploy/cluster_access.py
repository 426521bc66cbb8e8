"""How the admin commands reach the cluster (deploy.roll, deploy.released_homes): a client from
a kubeconfig, and one line instead of a traceback when there is no cluster or it refuses."""

import argparse
import sys
from collections.abc import Callable

NEEDS_CLUSTER = "this command needs the cluster's kubeconfig (aws eks update-kubeconfig)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)"
    )
    parser.add_argument("--context", help="kubeconfig context (default: its current context)")


def with_cluster(args: argparse.Namespace, command: Callable[[object], int]) -> int:
    """`command(api_client)`'s exit code; 2 with one line on stderr when the cluster cannot be
    reached or refuses a call."""
    from kubernetes import config as kubeconfig
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config.config_exception import ConfigException
    from urllib3.exceptions import HTTPError

    try:
        client = kubeconfig.new_client_from_config(args.kubeconfig, args.context)
    except ConfigException as e:
        print(f"error: no cluster to talk to ({e}); {NEEDS_CLUSTER}", file=sys.stderr)
        return 2
    try:
        return command(client)
    except ApiException as e:
        print(f"error: the cluster refused {e.status} {e.reason}: {e.body}", file=sys.stderr)
    except (HTTPError, OSError) as e:  # urllib3's MaxRetryError: refused, or no such name
        reason = getattr(e, "reason", None) or e
        host = client.configuration.host
        print(f"error: cannot reach the cluster at {host}: {reason}", file=sys.stderr)
    return 2
