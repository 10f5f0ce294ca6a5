"""The tokens that end a generation: llama.cpp's end-of-generation set, and every control token.

A model's file names one end-of-sequence id, but models end their text with others too:
Qwen2.5-Coder's GGUF names ``<|im_end|>`` (a chat turn's end) while an infilled middle ends at
``<|endoftext|>``, and a repository-level prompt's model may go on to ``<|file_sep|>``. llama.cpp
decides the set in its vocabulary loader (``src/llama-vocab.cpp``, build 11434: the ids the file
names for eos, eot and eom and for the FIM pad, repository and file-separator tokens, each of the
last five found by its text where the file names none, and every token whose text is one of
``EOG_TEXTS``); ``llama_cpp_end_ids`` follows it rule by rule, so that a model stops here where
it stops there. Where a rule finds several candidates (llama.cpp takes the first of an unordered
map), the lowest id is taken: the set is the same for every vocabulary known to have several.

``end_ids`` adds every other control token (an added token marked special): a suggestion is
text, and a ``<|fim_prefix|>`` or ``<|im_start|>`` after the middle means the model has left the
hole (llama.cpp renders such a token as nothing and goes on). So no special token's text ever
reaches a suggestion, and greedy output stays the target's own: the rule depends on the token
alone, and every drafter and the plain loop apply it alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# Texts by which llama.cpp finds a token the file does not name (the first of each that the
# vocabulary has), in its loader's order.
EOT_TEXTS = (
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
)
EOM_TEXTS = ("<|eom_id|>",)
FIM_PAD_TEXTS = ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")
FIM_REP_TEXTS = ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")
FIM_SEP_TEXTS = ("<|file_sep|>",)
# Every token with one of these texts ends a generation.
EOG_TEXTS = (
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
)


@dataclass(frozen=True)
class NamedIds:
    """The ids a model file names for the tokens the rules start from (None: not named)."""

    eos: tuple[int, ...] = ()  # a GGUF names one; a transformers config may name several
    eot: int | None = None
    eom: int | None = None
    fim_pad: int | None = None
    fim_rep: int | None = None
    fim_sep: int | None = None


def _named_or_found(named: int | None, texts: Iterable[str], vocab: Mapping[str, int]) -> int | None:
    if named is not None:
        return named
    found = [vocab[text] for text in texts if text in vocab]
    return min(found, default=None)


def llama_cpp_end_ids(vocab: Mapping[str, int], named: NamedIds) -> frozenset[int]:
    """The end-of-generation ids llama.cpp's loader gives this vocabulary (token text -> id)."""
    ids = {
        _named_or_found(named.fim_pad, FIM_PAD_TEXTS, vocab),
        _named_or_found(named.fim_rep, FIM_REP_TEXTS, vocab),
        _named_or_found(named.fim_sep, FIM_SEP_TEXTS, vocab),
        _named_or_found(named.eot, EOT_TEXTS, vocab),
        _named_or_found(named.eom, EOM_TEXTS, vocab),
        *named.eos,
    }
    ids.update(vocab[text] for text in EOG_TEXTS if text in vocab)
    ids.discard(None)
    # Its two workarounds: o200k_harmony's and solar-open's "<|end|>" ends a message, not the text;
    # and "</s>" is an ordinary token where Gemma 4's or PLaMo's own end marker is in the set.
    ending = {text for text in ("<|return|>", "<|call|>", "<|calls|>", "<|flush|>") if vocab.get(text) in ids}
    has_call = bool(ending & {"<|call|>", "<|calls|>"})
    if vocab.get("<|end|>") in ids and has_call and ending & {"<|return|>", "<|flush|>"}:
        ids.discard(vocab["<|end|>"])
    if "</s>" in vocab and any(vocab.get(t) in ids for t in ("<|tool_response>", "<|plamo:eos|>")):
        ids.discard(vocab["</s>"])
    return frozenset(int(i) for i in ids if i is not None)


def end_ids(vocab: Mapping[str, int], named: NamedIds, control: Iterable[int]) -> frozenset[int]:
    """llama.cpp's end-of-generation ids and every control token (``control``: the special ids)."""
    return llama_cpp_end_ids(vocab, named) | frozenset(int(i) for i in control)
