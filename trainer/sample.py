"""Text from a model file that `python -m trainer.fetch` wrote, one byte at a time.

    python -m trainer.sample --model model.pt --prompt "def main(" --tokens 200 --seed 1

The model reads and writes bytes (the trainer's byte-level tokens): the prompt is its UTF-8, the
output is decoded as UTF-8 with anything invalid shown as U+FFFD. The same --seed gives the same
text from the same model file.
"""

import argparse
import sys

import torch

from trainer.model import GPT
from trainer.presets import ModelConfig

PROG = "python -m trainer.sample"


def load(path: str) -> GPT:
    """The model of a trainer.fetch file, ready to generate; ValueError if it is not one."""
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
        model = GPT(ModelConfig(**saved["config"]))
        model.load_state_dict(saved["state_dict"])
    except (OSError, KeyError, TypeError, RuntimeError) as e:
        raise ValueError(f"{path}: not a model file of python -m trainer.fetch ({e})") from None
    return model.eval()


@torch.no_grad()
def generate(
    model: GPT, prompt: bytes, tokens: int, temperature: float, top_k: int, seed: int | None
) -> bytes:
    """`tokens` bytes following `prompt`: sampled from the top_k likeliest at `temperature`
    (0: always the likeliest), the model seeing at most its sequence length of context."""
    generator = torch.Generator()
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    ids = torch.tensor([list(prompt)], dtype=torch.long)
    for _ in range(tokens):
        logits = model.logits(ids[:, -model.config.seq_len :])[0, -1]
        if temperature == 0:
            following = logits.argmax().view(1)
        else:
            logits = logits / temperature
            if top_k:
                cut = torch.topk(logits, min(top_k, logits.numel())).values[-1]
                logits = logits.masked_fill(logits < cut, float("-inf"))
            following = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)
        ids = torch.cat([ids, following.view(1, 1)], dim=1)
    return bytes(ids[0, len(prompt) :].tolist())


def parser() -> argparse.ArgumentParser:
    found = argparse.ArgumentParser(
        prog=PROG, description="Generate text from a model file of python -m trainer.fetch."
    )
    found.add_argument(
        "--model", default="model.pt", help="the model file to read (default: %(default)s)"
    )
    found.add_argument("--prompt", default="\n", help="the text to continue (default: a newline)")
    found.add_argument(
        "--tokens", type=int, default=200, help="bytes to generate (default: %(default)s)"
    )
    found.add_argument(
        "--temperature",
        type=float,
        default=0.8,
        help="sampling temperature; 0: always the likeliest byte (default: %(default)s)",
    )
    found.add_argument(
        "--top-k",
        type=int,
        default=40,
        help="sample among the k likeliest bytes; 0: among all (default: %(default)s)",
    )
    found.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed of the sampling: the same seed, the same text; default: a fresh one each run",
    )
    return found


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    problems = [
        (not args.prompt, "--prompt must not be empty"),
        (args.tokens < 0, f"--tokens {args.tokens}; allowed: a whole number >= 0"),
        (not args.temperature >= 0, f"--temperature {args.temperature}; allowed: a number >= 0"),
        (args.top_k < 0, f"--top-k {args.top_k}; allowed: a whole number >= 0"),
    ]
    try:
        for wrong, message in problems:
            if wrong:
                raise ValueError(message)
        model = load(args.model)
    except ValueError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    prompt = args.prompt.encode()
    text = generate(model, prompt, args.tokens, args.temperature, args.top_k, args.seed)
    sys.stdout.write((prompt + text).decode("utf-8", errors="replace") + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
