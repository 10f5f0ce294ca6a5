"""``models_bench``'s llama-server batches, against the real server on the embedded GGUF: each
width is measured as a pass over that many new tokens after the prompt, which its cache holds
(llama-server's ``prompt_n``; a pass that fed more is not counted, and a width with none counted
is missing). Nothing is timed against anything."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from benchmarks.llama_server import LlamaServer, llama_server_binary
from benchmarks.models_bench import WIDTHS, peer_batches
from tests.support.llama_server import THREADS, gguf


@pytest.fixture(scope="module")
def llama() -> Iterator[LlamaServer]:
    with LlamaServer(gguf(), binary=llama_server_binary(), threads=THREADS) as server:
        yield server


def test_every_width_is_a_pass_over_that_many_new_tokens_after_the_prompt(llama):
    rng = random.Random(0)
    prompt = [rng.randrange(1000, 20000) for _ in range(64)]
    found = peer_batches(llama, prompt, 20000, 1, rng)
    assert set(found) == {f"verify{width}_ms" for width in WIDTHS[1:]}
    assert all(ms > 0 for ms in found.values())
