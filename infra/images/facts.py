"""What the platform knows about its image registries' kinds: ECR bills per GB-month of layers,
its policies are free, and an image is built where pulumi runs."""

from infra.core.facts import TF, Kind, ReplaceRule

KINDS = (
    Kind(
        "aws:ecr/repository:Repository",
        usage="ECR storage per GB-month of image layers",
        replace=ReplaceRule(("name", "encryptionConfigurations"), f"{TF}/ecr/repository.go"),
    ),
    Kind(
        "aws:ecr/lifecyclePolicy:LifecyclePolicy",
        free="ECR: lifecycle policies are free (they bound the repository's storage)",
    ),
    Kind(
        "aws:ecr/repositoryPolicy:RepositoryPolicy",
        free="ECR: a repository's permissions (storage and transfer bill, usage)",
    ),
    Kind(
        "docker-build:index:Image",
        free="built where pulumi runs; its layers bill as ECR storage (usage)",
    ),
)

# The platform's image repositories as a data holder, and what losing them loses.
IMAGES = "images"
HOLDERS = {
    IMAGES: "every image in the platform's ECR repositories, those the running jobs and servers "
    "pull included",
}
