"""`python -m deploy.released_homes` with the real kubernetes client against the local API: the
homes a removed user left (gp3-home volumes, Released) are listed, and one is handed to its
driver for deletion; other volumes are never touched."""

import yaml

from deploy import released_homes
from tests.kube_api import ADMIN
from tests.kube_api.rbac import Authorizer
from tests.kube_api.server import BUILTIN, Kind, KubeAPI

VOLUMES = Kind("", "v1", "PersistentVolume", "persistentvolumes", False, ("status",))


def volume(name: str, storage_class: str, phase: str, namespace: str) -> tuple[dict, dict]:
    body = {
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": "500Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": storage_class,
            "claimRef": {"namespace": namespace, "name": f"home-box-{name[-1]}"},
            "csi": {"driver": "ebs.csi.aws.com", "volumeHandle": f"vol-{name}"},
        },
    }
    return body, {"phase": phase}


def test_released_homes_are_listed_and_freed_one_by_one(tmp_path, capsys):
    api = KubeAPI(Authorizer([]), [*BUILTIN, VOLUMES]).start()
    try:
        for name, storage_class, phase, namespace in (
            ("pv-carol-0", "gp3-home", "Released", "dev-carol"),
            ("pv-alice-1", "gp3-home", "Bound", "dev-alice"),
            ("pv-scratch-2", "gp3", "Released", "team-a"),
        ):
            body, status = volume(name, storage_class, phase, namespace)
            stored = api.call(api.create, VOLUMES, "", body)
            api.call(api.replace, VOLUMES, stored, {**stored, "status": status})
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump(api.kubeconfig(api.add_token(ADMIN))))
        args = ["--kubeconfig", str(kubeconfig)]
        assert released_homes.main(args) == 0
        out = capsys.readouterr().out
        assert "pv-carol-0     500Gi  was dev-carol/home-box-0" in out
        assert "1 released homes" in out and "pv-alice" not in out and "pv-scratch" not in out
        assert released_homes.main([*args, "--delete", "pv-alice-1"]) == 1
        assert "is not a released home" in capsys.readouterr().err
        assert released_homes.main([*args, "--delete", "pv-carol-0"]) == 0
        policies = {
            v["metadata"]["name"]: v["spec"]["persistentVolumeReclaimPolicy"]
            for v in api.objects("persistentvolumes")
        }
        assert policies == {
            "pv-carol-0": "Delete",
            "pv-alice-1": "Retain",
            "pv-scratch-2": "Retain",
        }
        assert api.refusals == []
    finally:
        api.stop()
