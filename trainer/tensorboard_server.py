"""TensorBoard over several stores at once, where one that fails never stops the others.

`python -m trainer.tensorboard_server` takes TensorBoard's own flags (a team's TensorBoard:
`--logdir_spec s3:s3://<bucket>/checkpoints/<namespace>,efs:/efs/checkpoints`). TensorBoard
2.20 reloads every logdir in one loop (tensorboard/backend/event_processing/data_ingester.py,
LocalDataIngester.start): an exception out of one logdir's scan (S3 refusing a request, its
credentials not there yet) or out of one run's reload (EventMultiplexer.Reload catches only
OSError) ends that loop for good, and the server goes on serving whatever it had loaded, the
other stores' curves included, with no sign of it. Here each logdir's scan and each run's reload
is guarded instead: a failure is reported on stderr and tried again at the next reload.
"""

import sys

from tensorboard import main as tensorboard_main
from tensorboard.backend.event_processing import directory_watcher
from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer

_scan = EventMultiplexer.AddRunsFromDirectory
_reload = EventAccumulator.Reload


def _report(what: str, error: Exception) -> None:
    print(f"tensorboard: {what}: {type(error).__name__}: {error}; retried at the next reload",
          file=sys.stderr, flush=True)  # fmt: skip


def scan_guarded(self, path, name=None):
    try:
        return _scan(self, path, name)
    except Exception as e:  # noqa: BLE001 (any store's failure: boto3's, the file system's)
        _report(f"cannot list {path}", e)
        return self


def reload_guarded(self):
    try:
        return _reload(self)
    except directory_watcher.DirectoryDeletedError:
        raise  # the multiplexer drops the run: its folder is gone
    except Exception as e:  # noqa: BLE001
        _report(f"cannot read {self.path}", e)
        return self


def main() -> None:
    EventMultiplexer.AddRunsFromDirectory = scan_guarded
    EventAccumulator.Reload = reload_guarded
    tensorboard_main.run_main()


if __name__ == "__main__":
    main()
