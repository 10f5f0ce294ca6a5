"""Fill-in-the-middle: prompts that show the model the text after the cursor too.

Code models trained for infilling mark the prefix, the suffix and the hole with special tokens;
the four families below are the common ones, detected from the tokenizer's vocabulary. A template
is plain text with ``{prefix}`` and ``{suffix}`` slots; any ``<...>`` marker in it that is a
token of the vocabulary (SentencePiece's ``▁<PRE>`` counts for ``<PRE>``) becomes that one token
id, never text for the tokenizer to split, and the slots are encoded as ordinary text. A model
without such tokens (the default SmolLM2) gets a prefix-only prompt.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from lsp_server.context.tokens import Tokens

_MARKER = re.compile(r"<[^<>\s]{1,40}>")


@dataclass(frozen=True)
class FimTemplate:
    name: str
    template: str  # "{prefix}" and "{suffix}" slots, markers around them
    stops: tuple[str, ...] = ()  # decoded texts that end the middle (besides the model's EOS)


STYLES: dict[str, FimTemplate] = {
    t.name: t
    for t in [
        FimTemplate(
            "starcoder",
            "<fim_prefix>{prefix}<fim_suffix>{suffix}<fim_middle>",
            ("<|endoftext|>", "<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<fim_pad>", "<file_sep>"),
        ),
        FimTemplate(
            "qwen",
            "<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>",
            ("<|endoftext|>", "<|fim_pad|>", "<|file_sep|>", "<|fim_prefix|>", "<|im_end|>", "<|repo_name|>"),
        ),
        FimTemplate(
            "deepseek",
            "<｜fim▁begin｜>{prefix}<｜fim▁hole｜>{suffix}<｜fim▁end｜>",
            ("<｜end▁of▁sentence｜>", "<|EOT|>", "<｜fim▁begin｜>", "<｜fim▁hole｜>"),
        ),
        FimTemplate("codellama", "<PRE> {prefix} <SUF>{suffix} <MID>", ("<EOT>", "</s>")),
    ]
}
SETTING_NAMES = ("auto", "none", *STYLES)


def _markers(template: str) -> list[str]:
    return _MARKER.findall(template)


def resolve(setting: str, tokens: Tokens) -> FimTemplate | None:
    """The template for a ``fimTemplate`` setting: a style name, ``auto`` (the first style whose
    markers are all tokens of this vocabulary), ``none``, or a custom template string."""
    if setting == "none":
        return None
    if setting == "auto":
        for style in STYLES.values():
            if all(tokens.special_id(m) is not None for m in _markers(style.template)):
                return style
        return None
    if setting in STYLES:
        return STYLES[setting]
    if "{prefix}" in setting and "{suffix}" in setting:
        return FimTemplate("custom", setting, tuple(m for m in _markers(setting)))
    return None


def is_valid_setting(value: str) -> bool:
    return value in SETTING_NAMES or ("{prefix}" in value and "{suffix}" in value)


def assemble(
    template: FimTemplate, prefix_ids: list[int], suffix_ids: list[int], tokens: Tokens
) -> list[int]:
    """The prompt's ids: markers as single tokens, literal text encoded, slots filled."""
    out: list[int] = []
    for piece in re.split(r"(\{prefix\}|\{suffix\})", template.template):
        if piece == "{prefix}":
            out.extend(prefix_ids)
        elif piece == "{suffix}":
            out.extend(suffix_ids)
        elif piece:
            out.extend(_literal_ids(piece, tokens))
    return out


def overhead(template: FimTemplate, tokens: Tokens) -> int:
    """Tokens the template itself costs, outside its slots."""
    return len(assemble(template, [], [], tokens))


def _literal_ids(text: str, tokens: Tokens) -> list[int]:
    out: list[int] = []
    pos = 0
    for match in _MARKER.finditer(text):
        special = tokens.special_id(match.group())
        if special is None:
            continue
        if match.start() > pos:
            out.extend(tokens.encode(text[pos : match.start()]))
        out.append(special)
        pos = match.end()
    if pos < len(text):
        out.extend(tokens.encode(text[pos:]))
    return out
