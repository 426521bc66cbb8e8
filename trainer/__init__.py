"""The trainer: DDP/FSDP2 on a byte-level GPT, its checkpoints, launcher and tools."""

# The image's user (trainer/Dockerfile `useradd --uid`): every training pod, the TensorBoards and
# the copy pods run as it, and it owns what they write on EFS and FSx.
TRAINER_UID = 10001
# Pod Security "restricted" for a pod of the image running as that user, and for its containers.
RESTRICTED_POD = {
    "runAsNonRoot": True,
    "runAsUser": TRAINER_UID,
    "runAsGroup": TRAINER_UID,
    "seccompProfile": {"type": "RuntimeDefault"},
}
RESTRICTED_CONTAINER = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
