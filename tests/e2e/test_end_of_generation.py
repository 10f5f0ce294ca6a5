"""Every end-of-generation token ends a generation, as llama.cpp decides them, on the real files.

The rule (``speculative_complete/decoding/models/end_of_generation.py``) is held against llama.cpp's
own loader: the set llama-server prints for each real file must be the set computed here. Then the
engine, the command line and the server (every FIM template, custom ones and ``none`` included) stop
there on the real Qwen2.5-Coder files, and no special token's text reaches an answer.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from speculative_complete.decoding.engine.loop import GenerationConfig, SpeculativeEngine
from speculative_complete.decoding.forward.gguf_header import read_header
from speculative_complete.decoding.models.end_of_generation import NamedIds, end_ids, llama_cpp_end_ids
from tests.support.real_models import installed_real_model

QWEN_ENDS = {"<|endoftext|>", "<|im_end|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"}


def test_the_file_named_ids_win_over_the_texts_and_the_texts_fill_the_rest():
    vocab = {"<|endoftext|>": 0, "<|im_end|>": 1, "<|fim_pad|>": 2, "<PAD>": 3, "<fim_pad>": 4, "hello": 5}
    assert llama_cpp_end_ids(vocab, NamedIds()) == {0, 1, 2}  # the first pad text found: <|fim_pad|>
    assert llama_cpp_end_ids(vocab, NamedIds(fim_pad=3)) == {0, 1, 3}
    assert llama_cpp_end_ids(vocab, NamedIds(eos=(5,))) == {0, 1, 2, 5}
    assert llama_cpp_end_ids({"a": 0, "b": 1}, NamedIds(eot=1)) == {1}


def test_llama_cpps_two_workarounds_drop_end_and_a_plain_closing_s():
    harmony = {"<|end|>": 0, "<|return|>": 1, "<|call|>": 2}
    assert llama_cpp_end_ids(harmony, NamedIds()) == {1, 2}
    assert llama_cpp_end_ids({"<|end|>": 0, "<|return|>": 1}, NamedIds()) == {0, 1}
    gemma4 = {"</s>": 0, "<|tool_response>": 1, "<turn|>": 2}
    assert llama_cpp_end_ids(gemma4, NamedIds()) == {1, 2}
    assert llama_cpp_end_ids({"</s>": 0}, NamedIds()) == {0}


def test_every_control_token_ends_a_generation_too():
    vocab = {"<|endoftext|>": 0, "<|fim_prefix|>": 1, "x": 2}
    assert end_ids(vocab, NamedIds(), control=[0, 1]) == {0, 1}


# -- against llama.cpp's loader, on the real files ---------------------------------------------------
def llama_server_end_ids(path: Path) -> set[int]:
    """The end-of-generation ids llama-server's loader prints for ``path`` (its log at start)."""
    from benchmarks.llama_server import LlamaServerError, llama_server_binary

    try:
        binary = llama_server_binary(build=False)
    except LlamaServerError as exc:
        pytest.skip(str(exc))
    process = subprocess.Popen(
        [str(binary), "-m", str(path), "--port", "0", "-c", "256", "-t", "1", "-lv", "4"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
    )
    ids: set[int] = set()
    listing = False
    try:
        deadline = time.monotonic() + 120
        for line in process.stderr:
            if "printing all EOG tokens" in line:
                listing = True
            elif listing and (found := re.search(r"-\s+(\d+)\s+\(", line)):
                ids.add(int(found.group(1)))
            elif listing or time.monotonic() > deadline:
                break
    finally:
        process.kill()
        process.wait()
    assert listing, "llama-server printed no EOG tokens"
    return ids


def header_vocab_and_names(path: Path) -> tuple[dict[str, int], NamedIds]:
    """The token texts and named ids as llama.cpp reads them, from the GGUF header."""
    fields = read_header(path, strings=True).fields
    vocab = {str(token): i for i, token in enumerate(fields["tokenizer.ggml.tokens"])}

    def named(name: str) -> int | None:
        key = f"tokenizer.ggml.{name}_token_id"
        return int(fields[key]) if key in fields else None

    names = ("eot", "eom", "fim_pad", "fim_rep", "fim_sep")
    eos = named("eos")
    return vocab, NamedIds(eos=() if eos is None else (eos,), **{n: named(n) for n in names})


@pytest.mark.real_model
@pytest.mark.parametrize("name", ["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "gemma-3-270m", "default"])
def test_the_rule_gives_llama_cpps_own_set_for_each_real_file(name):
    from speculative_complete.decoding.models.loading import default_gguf_path

    path = default_gguf_path() if name == "default" else installed_real_model(name)
    vocab, named = header_vocab_and_names(path)
    ours = llama_cpp_end_ids(vocab, named)
    assert ours == llama_server_end_ids(path)
    texts = {token for token, i in vocab.items() if i in ours}
    if name.startswith("qwen"):
        assert texts >= QWEN_ENDS
    if name.startswith("gemma"):
        assert "<end_of_turn>" in texts


@pytest.mark.real_model
def test_the_loaded_models_end_ids_hold_llama_cpps_set_and_every_control_token(real_draft):
    vocab = real_draft.tokenizer.get_vocab()
    ends = real_draft.end_token_ids
    assert {vocab[text] for text in QWEN_ENDS} <= ends
    header_ids = llama_cpp_end_ids(*header_vocab_and_names(Path(real_draft.source)))
    assert header_ids <= ends
    special = {i for i, t in real_draft.tokenizer.added_tokens_decoder.items() if t.special}
    assert ends == header_ids | special
    assert vocab["<tool_call>"] not in ends  # an added token that is not special stays text


# -- generations stop there --------------------------------------------------------------------------
FIM_PROMPT = (
    "<|fim_prefix|>def add(a, b):\n    return <|fim_suffix|>\n\n"
    'print(add(1, 2), "is the sum")\n<|fim_middle|>'
)


def fim_ids(model, text: str = FIM_PROMPT) -> list[int]:
    return model.tokenizer.encode(text, add_special_tokens=False)


@pytest.mark.real_model
@pytest.mark.parametrize("stops", [(), ("\n",)])
def test_an_infilled_middle_ends_at_endoftext_not_at_max_tokens(real_small, stops):
    engine = SpeculativeEngine(real_small)
    config = GenerationConfig(max_new_tokens=40, stop_strings=stops)
    result = engine.generate(fim_ids(real_small), config, drafter=None)
    assert result.stop_reason in ("eos", "stop")
    assert len(result.token_ids) < 40
    assert "<|" not in result.text
    if not stops:
        assert result.stop_reason == "eos"
        ended = engine.generate(
            fim_ids(real_small), GenerationConfig(max_new_tokens=len(result.token_ids) + 1)
        )
        assert ended.token_ids == result.token_ids  # the end token itself is never part of the answer


@pytest.mark.real_model
def test_a_draft_model_can_propose_the_end_of_the_text(real_small, real_draft):
    """The draft's output layer computes its first rows and its special tokens
    (``DraftOutputLayer``): every end of generation among them, so that a draft can propose
    where the target's text ends; where the target's greedy choice ends the infilled middle, the
    draft (the same weights) gives that row the same choice."""
    engine = SpeculativeEngine(real_small)
    middle = engine.generate(fim_ids(real_small), GenerationConfig(max_new_tokens=40), drafter=None)
    assert middle.stop_reason == "eos"
    ids = fim_ids(real_small) + list(middle.token_ids)
    logits = real_draft.forward(ids, real_draft.forward.new_cache(), keep=1)[-1]
    assert all(torch.isfinite(logits[i]) for i in real_draft.end_token_ids)
    assert int(logits.argmax()) in real_draft.end_token_ids


@pytest.mark.real_model
def test_the_command_line_stops_at_the_end_of_the_middle(tmp_path):
    path = installed_real_model("qwen2.5-coder-0.5b")
    prompt = tmp_path / "fim.txt"
    prompt.write_text(FIM_PROMPT)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "speculative_complete.decoding",
            "--model",
            str(path),
            "--prompt-file",
            str(prompt),
        ]
        + ["--max-new-tokens", "40", "--drafter", "none", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    answer = json.loads(done.stdout.splitlines()[-1])
    assert answer["stop_reason"] == "eos"
    assert "<|" not in answer["text"] and answer["stats"]["new_tokens"] < 40


# -- through the server, every FIM template --------------------------------------------------------
SERVER_URI = "file:///work/stats.py"
# The cursor inside a call whose closing bracket and the rest of the file follow: the middle is
# the call's arguments, and the model ends it with <|endoftext|> in the middle of the line.
STATS = (
    "def mean(values):\n    return sum(values) / len(values)\n\n\n"
    "def spread(values):\n    centre = mean(\n    return max(values) - centre\n"
)
CURSOR = (5, len("    centre = mean("))
TEMPLATES = {
    "auto": "auto",
    "custom": "<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>",
    "none": "none",
}


@pytest.mark.real_model
@pytest.mark.asyncio
async def test_the_server_never_shows_special_text_with_any_fim_template():
    from tests.support import lsp as h

    path = installed_real_model("qwen2.5-coder-0.5b")
    client, _ = await h.start_initialized(model=path, options={"timeBudgetMs": 0})
    try:
        h.open_document(client, STATS, uri=SERVER_URI)
        answers = {}
        for name, template in TEMPLATES.items():
            await h.configure(client, {"fimTemplate": template})
            result = await h.inline(client, *CURSOR, uri=SERVER_URI)
            answers[name] = [item.insert_text for item in result.items]
        stats = await h.stats(client)
    finally:
        await h.stop(client)
    for name, texts in answers.items():
        assert all("<|" not in text and "\n" not in text for text in texts), (name, texts)
    # With the suffix in view the middle is the call's argument and its bracket, ended by the
    # model's own end token (the 0.5B's choice of argument is its own business).
    for name in ("auto", "custom"):
        (text,) = answers[name]
        assert re.match(r"\w+\)", text), (name, text)
    assert stats["failed"] == 0
