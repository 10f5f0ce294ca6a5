"""Prompts cut from real code (the standard library's own files), for the tests that decode on
real weights."""

from __future__ import annotations

import random
import sysconfig
from pathlib import Path

STDLIB = Path(sysconfig.get_paths()["stdlib"])

FILES = [
    "json/encoder.py",
    "textwrap.py",
    "shlex.py",
    "fractions.py",
    "bisect.py",
    "heapq.py",
    "csv.py",
    "string.py",
    "dataclasses.py",
    "functools.py",
]


def stdlib_prompts(count: int, prompt_chars: int = 900, seed: int = 0) -> list[str]:
    """Text before a cursor placed after the indentation of a non-blank line of real code."""
    rng = random.Random(seed)
    prompts = []
    while len(prompts) < count:
        text = (STDLIB / FILES[len(prompts) % len(FILES)]).read_text()
        lines = text.splitlines(keepends=True)
        index = rng.randrange(20, len(lines) - 1)
        if len(lines[index].strip()) < 12:
            continue
        offset = sum(len(line) for line in lines[:index])
        indent = len(lines[index]) - len(lines[index].lstrip())
        prompts.append(text[max(0, offset + indent - prompt_chars) : offset + indent])
    return prompts
