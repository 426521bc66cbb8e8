"""The usage recorder: which nodes ran and which jobs held quota, kept after the cluster forgets
them (recorder.py), for `devctl usage`.

Its image (Dockerfile, build context this folder alone) runs `python -m usagerecorder.recorder`;
the stack's CronJob (infra/billing/usage_recorder.py) gives the arguments.
"""
