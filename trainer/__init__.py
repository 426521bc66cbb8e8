"""The trainer: DDP/FSDP2 on a byte-level GPT, its checkpoints, launcher and tools."""

# The image's user (trainer/Dockerfile `useradd --uid`): every training pod, the TensorBoards and
# the copy pods run as it, and it owns what they write on EFS and FSx.
TRAINER_UID = 10001
