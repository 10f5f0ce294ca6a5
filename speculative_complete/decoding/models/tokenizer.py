"""A saved fast tokenizer on the ``tokenizers`` library alone, without transformers.

transformers' fast tokenizer class wraps this very Rust tokenizer; what it adds on top costs a
ready server resident memory (the import and the wrapper's own tables; ``benchmarks/README.md``)
for calls the project does not make. ``LeanTokenizer`` gives the part of that class's interface that
``decoding`` and ``lsp_server`` use, with the same results: ``tests/decoding/models/test_tokenizer.py``
checks it against transformers' class on real text, ids and pieces. It loads only a folder that
transformers saved as a plain fast tokenizer (``tokenizer.json`` and a ``tokenizer_config.json``
naming that class); anything else (a slow tokenizer, custom code) goes through transformers.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer

PLAIN_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")
# transformers classes that add nothing to their Rust tokenizer but the pipeline their __init__
# builds (which differs from the one a GGUF gave: Qwen2Tokenizer's adds an NFC normalizer that
# neither the file nor llama.cpp has); ``save_plain`` keeps the tokenizer as the file gave it.
PIPELINE_ONLY_CLASSES = ("Qwen2Tokenizer",)
SAVED_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
SPECIAL_ROLES = ("bos_token", "eos_token", "unk_token", "pad_token")


def save_plain(tokenizer: Any, folder: Path) -> None:
    """Rewrites a tokenizer transformers saved in ``folder`` as a plain fast one where its class is
    one of ``PIPELINE_ONLY_CLASSES``: ``tokenizer.json`` as its Rust tokenizer is now, the config
    naming the plain class. Loading the folder again (here or in transformers) then tokenizes as
    this tokenizer does, rather than as the class would rebuild it."""
    config_path = folder / "tokenizer_config.json"
    settings = json.loads(config_path.read_text(encoding="utf-8"))
    plain_already = settings.get("tokenizer_class") not in PIPELINE_ONLY_CLASSES
    if plain_already or settings.get("clean_up_tokenization_spaces"):
        return
    (folder / "tokenizer.json").write_text(tokenizer.backend_tokenizer.to_str(), encoding="utf-8")
    settings["tokenizer_class"] = PLAIN_CLASSES[0]
    config_path.write_text(json.dumps(settings, indent=2, ensure_ascii=False), encoding="utf-8")


def _content(value: Any) -> str | None:
    """A special token as ``tokenizer_config.json`` spells it: a string or an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class LeanTokenizer:
    """Encode and decode as transformers' fast tokenizer does, for a plain ``tokenizer.json``."""

    def __init__(
        self, backend: Tokenizer, roles: dict[str, str | None], folder: Path, additional: Sequence[str] = ()
    ) -> None:
        self.backend_tokenizer = backend
        self.folder = folder  # where it was loaded from: ``save_pretrained`` copies its files
        self._ids = {role: self._id(token) for role, token in roles.items()}
        self._additional = list(additional)

    @classmethod
    def from_folder(cls, folder: Path) -> LeanTokenizer | None:
        """The folder's tokenizer, or None where it is not a plain fast tokenizer."""
        try:
            settings = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
            if settings.get("tokenizer_class") not in PLAIN_CLASSES or settings.get(
                "clean_up_tokenization_spaces"
            ):
                return None  # transformers would post-process decoded text: leave it to transformers
            backend = Tokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception:  # OSError, bad JSON, or the bare Exception tokenizers raises on a bad file
            return None
        roles = {role: _content(settings.get(role)) for role in SPECIAL_ROLES}
        additional = settings.get("additional_special_tokens") or settings.get("extra_special_tokens") or []
        names = [n for n in map(_content, additional if isinstance(additional, list) else []) if n]
        return cls(backend, roles, folder, names)

    def _id(self, token: str | None) -> int | None:
        return None if token is None else self.backend_tokenizer.token_to_id(token)

    bos_token_id = property(lambda self: self._ids["bos_token"])
    eos_token_id = property(lambda self: self._ids["eos_token"])
    unk_token_id = property(lambda self: self._ids["unk_token"])
    pad_token_id = property(lambda self: self._ids["pad_token"])

    @property
    def added_tokens_decoder(self) -> dict[int, AddedToken]:
        return self.backend_tokenizer.get_added_tokens_decoder()

    @property
    def all_special_ids(self) -> list[int]:
        """The role tokens' ids and the config's additional special tokens, as transformers
        counts them (other added tokens marked special are in ``added_tokens_decoder``)."""
        ids = [i for i in self._ids.values() if i is not None]
        ids += [i for i in map(self._id, self._additional) if i is not None]
        return sorted(set(ids))

    def __len__(self) -> int:
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=True)

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": self.encode(text, add_special_tokens=add_special_tokens)}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.backend_tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def get_vocab(self) -> dict[str, int]:
        return self.backend_tokenizer.get_vocab(with_added_tokens=True)

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str | None]:
        return [self.backend_tokenizer.id_to_token(int(i)) for i in ids]

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> int | list[int | None] | None:
        """A token's id, the unknown token's where it has none (as transformers does)."""
        if isinstance(tokens, str):
            found = self._id(tokens)
            return self.unk_token_id if found is None else found
        return [self.convert_tokens_to_ids(token) for token in tokens]

    def save_pretrained(self, folder: str | Path) -> None:
        """The files it was loaded from, into ``folder`` (transformers loads them as before)."""
        Path(folder).mkdir(parents=True, exist_ok=True)
        for name in SAVED_FILES:
            if (self.folder / name).is_file():
                shutil.copyfile(self.folder / name, Path(folder) / name)
