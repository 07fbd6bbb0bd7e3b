"""The prompts of a run: random ones of an exact token length, or lines of a JSONL file."""

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from server.models.tokenizer import Tokenizer

# Decoding random ids and encoding the text again rarely gives back the same count; a few rounds of trimming
# and topping up settle it.
MAX_LENGTH_FIXES = 20


class DatasetError(ValueError):
    pass


@dataclass(frozen=True)
class BenchRequest:
    output_len: int
    prompt: str | None = None
    messages: list[dict] | None = None
    prompt_len: int | None = None  # as our tokenizer counts it, where known


def load_tokenizer(path: str | None) -> Tokenizer:
    """A tokenizer.json file or a folder holding one; by default the bundled model's."""
    if path is None:
        from server.models.loader import resolve_model_folder

        return Tokenizer.from_folder(resolve_model_folder(None))
    location = Path(path)
    if location.is_file():
        import tokenizers

        return Tokenizer(tokenizers.Tokenizer.from_file(str(location)))
    return Tokenizer.from_folder(location)


def random_requests(tokenizer: Tokenizer, num: int, input_len: int, output_len: int, seed: int) -> list[BenchRequest]:
    rng = np.random.default_rng(seed)
    candidates = np.array(sorted(set(range(tokenizer.vocab_size)) - tokenizer.all_special_ids))
    return [
        BenchRequest(output_len, prompt=text, prompt_len=length)
        for text, length in (random_prompt(tokenizer, candidates, input_len, rng) for _ in range(num))
    ]


def random_prompt(tokenizer: Tokenizer, candidates: np.ndarray, length: int,
                  rng: np.random.Generator) -> tuple[str, int]:
    """Text that encodes to ``length`` tokens (without special tokens), and the count it finally got."""
    ids = rng.choice(candidates, length).tolist()
    for _ in range(MAX_LENGTH_FIXES):
        text = tokenizer.decode(ids)
        encoded = tokenizer.encode(text, add_special_tokens=False)
        if len(encoded) == length:
            break
        ids = encoded[:length] + rng.choice(candidates, max(0, length - len(encoded))).tolist()
    return text, len(encoded)


def jsonl_requests(path: str, num: int, output_len: int, endpoint: str) -> list[BenchRequest]:
    """The file's lines in order, cycled until there are ``num``."""
    try:
        lines = [line for line in Path(path).read_text().splitlines() if line.strip()]
    except OSError as error:
        raise DatasetError(f"cannot read the dataset {path}: {error}") from None
    if not lines:
        raise DatasetError(f"the dataset {path} has no lines")
    requests = [parse_line(line, f"{path}:{number}", output_len, endpoint) for number, line in enumerate(lines, 1)]
    return [requests[i % len(requests)] for i in range(num)]


def parse_line(line: str, where: str, output_len: int, endpoint: str) -> BenchRequest:
    try:
        entry = json.loads(line)
    except json.JSONDecodeError as error:
        raise DatasetError(f"{where}: not JSON ({error})") from None
    if not isinstance(entry, dict):
        raise DatasetError(f"{where}: expected an object with 'prompt' or 'messages'")
    limit = entry.get("max_tokens", entry.get("output_len", output_len))
    if not isinstance(limit, int) or limit < 1:
        raise DatasetError(f"{where}: max_tokens/output_len must be a positive integer")
    prompt, messages = entry.get("prompt"), entry.get("messages")
    if isinstance(prompt, str):
        return BenchRequest(limit, prompt=prompt)
    if isinstance(messages, list) and messages:
        if endpoint == "completions":
            raise DatasetError(f"{where}: chat messages need --endpoint chat")
        return BenchRequest(limit, messages=messages)
    raise DatasetError(f"{where}: expected a string 'prompt' or a non-empty 'messages' list")
