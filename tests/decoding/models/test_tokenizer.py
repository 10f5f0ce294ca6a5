"""``speculative_complete/decoding/models/tokenizer.py`` against transformers' fast tokenizer on the
same saved files: the embedded model's tokenizer, on real code and on edge cases, must encode,
decode and name tokens exactly as transformers does, and a server on the default model must not
import transformers."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from speculative_complete.decoding.engine.healing import token_bytes_table
from speculative_complete.decoding.models.tokenizer import LeanTokenizer

TEXTS = [
    "def f(x):\n    return x + 1\n",
    "\tif a  and   b:\r\n\t\tpass  \n\n\n",
    "naïve café — ünïcödé ✓ 😀 中文 \u00a0nbsp",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|> <|im_end|>x",
    "",
    " ",
    "\n",
    "x = '''\\x00\\t'''  # \u2028 line separator",
]


@pytest.fixture(scope="module")
def pair(default_tokenizer_folder):
    from transformers import AutoTokenizer

    lean = LeanTokenizer.from_folder(Path(default_tokenizer_folder))
    assert lean is not None
    return lean, AutoTokenizer.from_pretrained(str(default_tokenizer_folder))


def _real_code() -> list[str]:
    import json as json_module
    import textwrap

    sources = [Path(textwrap.__file__), Path(json_module.__file__).parent / "decoder.py", Path(__file__)]
    return [p.read_text(encoding="utf-8") for p in sources]


def test_the_default_model_loads_the_lean_tokenizer(default_model):
    assert isinstance(default_model.tokenizer, LeanTokenizer)


@pytest.mark.parametrize("special", [False, True])
def test_encoding_matches_transformers(pair, special):
    lean, reference = pair
    for text in TEXTS + _real_code():
        expected = reference(text, add_special_tokens=special)["input_ids"]
        assert lean(text, add_special_tokens=special)["input_ids"] == expected
        assert lean.encode(text, add_special_tokens=special) == expected


@pytest.mark.parametrize("skip", [False, True])
def test_decoding_matches_transformers(pair, skip):
    lean, reference = pair
    rng = random.Random(0)
    specials = reference.all_special_ids
    for _ in range(300):
        ids = [rng.randrange(len(reference)) for _ in range(rng.randrange(1, 12))]
        ids += rng.sample(specials, k=min(2, len(specials)))
        rng.shuffle(ids)
        assert lean.decode(ids, skip_special_tokens=skip) == reference.decode(ids, skip_special_tokens=skip)
    for text in _real_code():
        ids = reference(text, add_special_tokens=False)["input_ids"]
        assert lean.decode(ids) == reference.decode(ids) == text


def test_the_vocabulary_and_special_tokens_match_transformers(pair):
    lean, reference = pair
    assert len(lean) == len(reference)
    assert lean.get_vocab() == reference.get_vocab()
    ids = list(range(len(reference)))
    pieces = reference.convert_ids_to_tokens(ids)
    assert lean.convert_ids_to_tokens(ids) == pieces
    assert lean.convert_tokens_to_ids(pieces[:500] + ["<|im_end|>", "no such piece"]) == (
        reference.convert_tokens_to_ids(pieces[:500] + ["<|im_end|>", "no such piece"])
    )
    assert lean.convert_tokens_to_ids("<|im_start|>") == reference.convert_tokens_to_ids("<|im_start|>")
    for name in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
        assert getattr(lean, name) == getattr(reference, name), name
    assert sorted(lean.all_special_ids) == sorted(reference.all_special_ids)
    assert {i: t.content for i, t in lean.added_tokens_decoder.items()} == {
        i: t.content for i, t in reference.added_tokens_decoder.items()
    }
    # token healing's table is built from these calls: the same bytes for every id
    assert token_bytes_table(lean) == token_bytes_table(reference)


def test_saved_files_load_in_transformers_and_here(pair, tmp_path):
    from transformers import AutoTokenizer

    lean, _ = pair
    lean.save_pretrained(tmp_path / "copy")
    text = _real_code()[0]
    expected = lean.encode(text)
    assert AutoTokenizer.from_pretrained(str(tmp_path / "copy"))(text)["input_ids"] == expected
    again = LeanTokenizer.from_folder(tmp_path / "copy")
    assert again is not None and again.encode(text) == expected


def test_other_tokenizers_are_left_to_transformers(pair, tmp_path):
    lean, _ = pair
    config = json.loads((lean.folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    cases = {
        "slow": {**config, "tokenizer_class": "LlamaTokenizer"},
        "cleanup": {**config, "clean_up_tokenization_spaces": True},
    }
    for name, settings in cases.items():
        folder = tmp_path / name
        lean.save_pretrained(folder)
        (folder / "tokenizer_config.json").write_text(json.dumps(settings), encoding="utf-8")
        assert LeanTokenizer.from_folder(folder) is None, name
    broken = tmp_path / "broken"
    lean.save_pretrained(broken)
    (broken / "tokenizer.json").write_text("{not json", encoding="utf-8")
    assert LeanTokenizer.from_folder(broken) is None
    assert LeanTokenizer.from_folder(tmp_path / "missing") is None


def test_a_server_on_the_default_model_does_not_import_transformers(default_model):
    """What keeps ~20 MB out of a ready server's memory (the model is cached by the fixture)."""
    code = (
        "import sys\n"
        "from speculative_complete.lsp_server.config import Settings\n"
        "from speculative_complete.lsp_server.local.loading import load_runtime\n"
        "runtime = load_runtime(Settings())\n"
        "runtime.generate\n"
        "print(type(runtime.engine.target.tokenizer).__name__, 'transformers' in sys.modules)\n"
    )
    command = [sys.executable, "-c", code]
    out = subprocess.run(command, capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.split() == ["LeanTokenizer", "False"], out.stderr[-2000:]


def test_a_gguf_s_first_load_builds_what_transformers_builds_from_it(tmp_path, monkeypatch):
    """A new GGUF's config and tokenizer come from this project's header reader and transformers'
    fast GGUF tokenizer path, never from gguf's ``GGUFReader`` (AutoTokenizer and AutoConfig parse
    the whole header with it: half a minute for a 150k-token vocabulary). What they build must be
    what AutoTokenizer and AutoConfig build from the same file: the same ids for real code, special
    tokens and edge cases, the same vocabulary, and the config values ``LoadedModel`` reads."""
    import gguf
    from transformers import AutoConfig, AutoTokenizer

    from speculative_complete.decoding.models.loading import default_gguf_path, load_model

    path = default_gguf_path()
    folder, name = str(path.parent), path.name
    reference = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
    config = AutoConfig.from_pretrained(folder, gguf_file=name, local_files_only=True)

    def refuse(*args, **kwargs):
        raise AssertionError("gguf.GGUFReader read the file")

    monkeypatch.setattr(gguf.GGUFReader, "__init__", refuse)
    monkeypatch.setenv("DECODING_CACHE_DIR", str(tmp_path))
    first = load_model(str(path), device="cpu", dtype="float32")
    again = load_model(str(path), device="cpu", dtype="float32")
    assert isinstance(again.tokenizer, LeanTokenizer)
    for loaded in (first, again):
        for text in TEXTS + _real_code():
            assert loaded.tokenizer.encode(text) == reference.encode(text), text
        assert loaded.tokenizer.get_vocab() == reference.get_vocab()
        assert sorted(loaded.tokenizer.all_special_ids) == sorted(reference.all_special_ids)
        assert loaded.max_context == config.max_position_embeddings
        assert loaded.named_ids().eos == (config.eos_token_id,)
        assert loaded.config.model_type == config.model_type
