"""Fill-in-the-middle: prompts that show the model the text after the cursor too.

Code models trained for infilling mark the prefix, the suffix and the hole with special tokens;
the four families below are the common ones, detected from the tokenizer's vocabulary. A template
is plain text with ``{prefix}`` and ``{suffix}`` slots; any ``<...>`` marker in it that is a
token of the vocabulary (SentencePiece's ``▁<PRE>`` counts for ``<PRE>``) becomes that one token
id, never text for the tokenizer to split, and the slots are encoded as ordinary text. A model
without such tokens (the default SmolLM2) gets a prefix-only prompt.

The cursor's line up to the cursor goes after the middle marker rather than at the prefix slot's
end (``line_in_middle``)::

    <|fim_prefix|>{rows above}<|fim_suffix|>{suffix}<|fim_middle|>{the line so far}

At the prefix slot's end each keystroke would change the prompt before the suffix, whose tokens
(up to a quarter of the budget) would then be prefilled again at every keystroke; after the
marker they are prefilled once per line, and not even that where the lines typed below the
prompt's rows go there too (``builder.py``: the prefix slot then changes only when the rows are
chosen again). The model's distribution is the one it was trained on: FIM training cuts the
middle at arbitrary characters, so this asks for the middles that begin with the text typed
since. It is also what llama.cpp's ``/infill`` documents for its ``prompt``
field, which llama.vim and llama.vscode fill with that line (its code, build 11434, appends it to
the prefix instead: ggml-org/llama.cpp#22678, and pays the suffix's prefill at each keystroke).

Qwen2.5-Coder was also trained on whole repositories (its technical report, arXiv 2409.12186,
"Repo-Level FIM format"; its README's repository-level example; llama.cpp's ``/infill`` builds
the same), so where the vocabulary has ``<|repo_name|>`` and ``<|file_sep|>`` too, ``auto`` picks
``qwen-repo``: the files the prompt shows besides the current one go before the FIM prompt, each
under its path, and the current file's path comes last::

    <|repo_name|>{name}
    <|file_sep|>{path}
    {text}
    <|file_sep|>{current path}
    <|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>

Each marker is one token id and the text between two markers is encoded alone
(``repo_ids``), so what the builder counts per piece is exactly what the model is fed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from speculative_complete.lsp_server.context.tokens import Tokens

_MARKER = re.compile(r"<[^<>\s]{1,40}>")


@dataclass(frozen=True)
class FimTemplate:
    name: str
    template: str  # "{prefix}" and "{suffix}" slots, markers around them
    stops: tuple[str, ...] = ()  # decoded texts that end the middle (besides the model's EOS)
    # The repository-level layout's markers, where the model was trained on one ("": none).
    repo_name: str = ""
    file_sep: str = ""
    # The cursor's line up to the cursor goes after the template, past the middle marker, so a
    # keystroke changes only the prompt's end (the module's docstring says why the model is the
    # same). Byte-level vocabularies only: a SentencePiece one (CodeLlama) would encode the line
    # with a leading space of its own; custom templates keep the line in their prefix slot.
    line_in_middle: bool = False

    @property
    def repo_level(self) -> bool:
        return bool(self.repo_name and self.file_sep)

    @property
    def markers(self) -> list[str]:
        """Every marker the template needs as a token of the vocabulary."""
        return _markers(self.template) + ([self.repo_name, self.file_sep] if self.repo_level else [])


@dataclass(frozen=True)
class RepoFile:
    """A file the repository-level layout shows before the current one: its path and its text."""

    path: str
    text: str  # what is shown of it, whole lines, without a final newline


_QWEN_STOPS = (
    "<|endoftext|>",
    "<|fim_pad|>",
    "<|file_sep|>",
    "<|fim_prefix|>",
    "<|im_end|>",
    "<|repo_name|>",
)


STYLES: dict[str, FimTemplate] = {
    t.name: t
    for t in [
        FimTemplate(
            "starcoder",
            "<fim_prefix>{prefix}<fim_suffix>{suffix}<fim_middle>",
            ("<|endoftext|>", "<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<fim_pad>", "<file_sep>"),
            line_in_middle=True,
        ),
        # before "qwen": auto takes the first style the vocabulary has every marker of
        FimTemplate(
            "qwen-repo",
            "<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>",
            _QWEN_STOPS,
            repo_name="<|repo_name|>",
            file_sep="<|file_sep|>",
            line_in_middle=True,
        ),
        FimTemplate(
            "qwen",
            "<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>",
            _QWEN_STOPS,
            line_in_middle=True,
        ),
        FimTemplate(
            "deepseek",
            "<｜fim▁begin｜>{prefix}<｜fim▁hole｜>{suffix}<｜fim▁end｜>",
            ("<｜end▁of▁sentence｜>", "<|EOT|>", "<｜fim▁begin｜>", "<｜fim▁hole｜>"),
            line_in_middle=True,
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
            if all(tokens.special_id(m) is not None for m in style.markers):
                return style
        return None
    if setting in STYLES:
        style = STYLES[setting]
        if style.repo_level and not all(tokens.special_id(m) is not None for m in style.markers):
            return file_only(style)  # the layout needs its markers as tokens: never as text
        return style
    if "{prefix}" in setting and "{suffix}" in setting:
        return FimTemplate("custom", setting, tuple(m for m in _markers(setting)))
    return None


def is_valid_setting(value: str) -> bool:
    return value in SETTING_NAMES or ("{prefix}" in value and "{suffix}" in value)


def assemble(
    template: FimTemplate,
    prefix_ids: Sequence[int],
    suffix_ids: Sequence[int],
    tokens: Tokens,
    middle_ids: Sequence[int] = (),
) -> list[int]:
    """The prompt's ids: markers as single tokens, literal text encoded, slots filled, and the
    middle begun with ``middle_ids`` (the cursor's line, for a ``line_in_middle`` template)."""
    out: list[int] = []
    for piece in re.split(r"(\{prefix\}|\{suffix\})", template.template):
        if piece == "{prefix}":
            out.extend(prefix_ids)
        elif piece == "{suffix}":
            out.extend(suffix_ids)
        elif piece:
            out.extend(_literal_ids(piece, tokens))
    return out + list(middle_ids)


def overhead(template: FimTemplate, tokens: Tokens) -> int:
    """Tokens the template itself costs, outside its slots."""
    return len(assemble(template, [], [], tokens))


def file_only(template: FimTemplate) -> FimTemplate:
    """The same template without its repository layout: what a prompt too small for the
    repository's name and the current file's path gets."""
    if not template.repo_level:
        return template
    name = template.name.removesuffix("-repo")
    return STYLES[name] if name in STYLES else replace(template, name=name, repo_name="", file_sep="")


def repo_line(name: str) -> str:
    """The text after ``<|repo_name|>``."""
    return f"{name}\n"


def file_text(path: str, text: str | None = None) -> str:
    """The text after a ``<|file_sep|>``: the path on its line, then the file's text (none for the
    current file, whose text is the FIM prompt that follows)."""
    return f"{path}\n" if text is None else f"{path}\n{text}\n"


def repo_cost(name: str, current_path: str, tokens: Tokens) -> int:
    """Tokens the layout costs besides the other files: the repository's name and the current
    file's path, with their markers (one id each)."""
    return 2 + tokens.count(repo_line(name)) + tokens.count(file_text(current_path))


def file_cost(path: str, text: str, tokens: Tokens) -> int:
    """Tokens one other file costs in the layout, its ``<|file_sep|>`` included."""
    return 1 + tokens.count(file_text(path, text))


def repo_ids(
    template: FimTemplate, name: str, files: Sequence[RepoFile], current_path: str, tokens: Tokens
) -> list[int]:
    """The ids before the FIM prompt: each marker one token id, each piece between markers
    encoded alone (so ``repo_cost`` and ``file_cost`` count exactly these)."""
    repo_id, sep_id = tokens.special_id(template.repo_name), tokens.special_id(template.file_sep)
    if repo_id is None or sep_id is None:
        raise ValueError(f"{template.name}: the vocabulary lacks {template.repo_name} or {template.file_sep}")
    out = [repo_id, *tokens.encode(repo_line(name))]
    for file in files:
        out += [sep_id, *tokens.encode(file_text(file.path, file.text))]
    out += [sep_id, *tokens.encode(file_text(current_path))]
    return out


def repo_text(template: FimTemplate, name: str, files: Sequence[RepoFile], current_path: str) -> str:
    """What ``repo_ids`` shows, as text with the markers spelled out: one value that changes
    exactly when those ids do (what the builder keeps rows across keystrokes by)."""
    pieces = [template.repo_name, repo_line(name)]
    for file in files:
        pieces += [template.file_sep, file_text(file.path, file.text)]
    return "".join([*pieces, template.file_sep, file_text(current_path)])


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
