"""The GPU registration watcher: GPU nodes whose GPUs never register are replaced (watcher.py).

Its image (Dockerfile, build context this folder alone) runs `python -m gpuwatch.watcher`; the
stack's CronJob (infra/components/gpu_registration_watch.py) gives the arguments.
"""
