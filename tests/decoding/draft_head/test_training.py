"""The draft head's training: its chains compute what drafting computes, features are cached and
reused, and training runs end to end (on the CPU, per batch, and on CUDA where there is one)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from speculative_complete.decoding.draft_head.network import HeadCache, load_head
from speculative_complete.decoding.draft_head.training import TEMPERATURES, chain_outputs, held_out
from speculative_complete.decoding.drafters import load_head_drafter
from speculative_complete.decoding.forward.transformers_loader import from_transformers
from tests.support.draft_heads import tiny_head
from tests.support.tiny_models import tiny_model


@torch.no_grad()
def test_training_chains_compute_what_drafting_computes():
    """Pass d's entry j of ``chain_outputs`` (one batched pass per depth, ``chain_mask``) equals
    drafting's sequence: true entries up to s = j - d + 1 in one pass, then d - 1 chained steps."""
    forward = from_transformers(tiny_model(5, layers=1), 0)
    head = tiny_head(forward, seed=3)
    torch.manual_seed(1)
    hidden = torch.randn(1, 14, forward.shape.dim)
    embeds = torch.randn(1, 13, forward.shape.dim)
    depth = 3
    outputs = chain_outputs(head, hidden, embeds, depth)
    for d in range(1, depth + 1):
        for j in range(d - 1, 13):
            s = j - d + 1
            cache = HeadCache()
            rows = s + 1
            mask = torch.ones(rows, rows, dtype=torch.bool).tril_()
            g = head(hidden[:, :rows], embeds[:, :rows], torch.arange(rows), mask, cache)[:, -1:]
            for entry in range(s + 1, j + 1):
                mask = torch.ones(1, cache.length + 1, dtype=torch.bool)
                g = head(g, embeds[:, entry : entry + 1], torch.tensor([entry]), mask, cache)
            assert torch.allclose(g[0, 0], outputs[d - 1][0, j], atol=1e-5), (d, j)


def write_corpus(folder: Path, files: int) -> Path:
    """``files`` small Python modules, each a little different."""
    folder.mkdir()
    for i in range(files):
        body = "".join(f"    value_{j} = compute(value_{j - 1}, {i})\n" for j in range(1, 12))
        (folder / f"module_{i}.py").write_text(f"def function_{i}(value_0):\n{body}    return value_11\n")
    return folder


def test_features_for_more_tokens_reuse_the_full_shards_of_a_run_over_fewer(
    tmp_path, monkeypatch, default_tokenizer_folder
):
    """Training on more tokens computes only the new sequences' features: the shards an earlier
    run filled are linked, and what comes out is what a run from scratch computes."""
    from safetensors.torch import load_file

    from speculative_complete.decoding.draft_head.training import SHARD_SEQUENCES, Target, features
    from tests.support.tiny_models import save_tiny_model

    assert SHARD_SEQUENCES == 32
    monkeypatch.setenv("DECODING_CACHE_DIR", str(tmp_path / "cache"))
    target = Target.load(str(save_tiny_model(tmp_path / "tiny", default_tokenizer_folder)), "int8")
    corpus = write_corpus(tmp_path / "corpus", 80)
    other_seed = features(target, corpus, False, 70 * 64, 64, 1)  # another order of the files
    fewer = features(target, corpus, False, 40 * 64, 64, 0)  # 40 sequences: shard 1 holds 8
    more = features(target, corpus, False, 70 * 64, 64, 0)  # 70: shards 0 and 1 full, 2 holds 6
    assert len(fewer) == 2 and len(more) == 3
    assert fewer[0].samefile(more[0])
    assert not fewer[1].samefile(more[1])  # not full in the run over fewer: computed again
    assert not any(mine.samefile(theirs) for mine in fewer + more for theirs in other_seed)

    monkeypatch.setenv("DECODING_CACHE_DIR", str(tmp_path / "scratch"))
    scratch = features(target, corpus, False, 70 * 64, 64, 0)
    for reused, computed in zip(more, scratch, strict=True):
        got, want = load_file(str(reused)), load_file(str(computed))
        assert torch.equal(got["tokens"], want["tokens"]) and torch.equal(got["hidden"], want["hidden"])
    assert not torch.equal(load_file(str(other_seed[0]))["tokens"], load_file(str(fewer[0]))["tokens"])


def test_train_head_runs_end_to_end_and_its_head_drafts(tmp_path, monkeypatch, default_tokenizer_folder):
    """``python -m speculative_complete.decoding.draft_head.training`` on a tiny model and a small
    corpus: features cached, loss down over epochs, a report on held-out files, and the head loads
    and drafts."""
    from speculative_complete.decoding.draft_head.training import main
    from speculative_complete.decoding.models.loading import load_model
    from tests.support.tiny_models import save_tiny_model

    monkeypatch.setenv("DECODING_CACHE_DIR", str(tmp_path / "cache"))
    model_dir = save_tiny_model(tmp_path / "tiny", default_tokenizer_folder, seed=3)
    corpus = write_corpus(tmp_path / "corpus", 40)
    assert any(held_out(f"module_{i}.py") for i in range(40))
    out = tmp_path / "head"
    argv = ["--model", str(model_dir), "--quantization", "int8", "--corpus", str(corpus), "--out", str(out)]
    argv += ["--tokens", "3072", "--held-out-tokens", "256", "--sequence", "64", "--vocab", "512"]
    argv += ["--epochs", "3", "--batch", "4", "--depth", "2", "--lr", "3e-3"]
    assert main(argv) == 0
    progress = json.loads((out / "progress.json").read_text())
    assert progress["epochs"] == 3 and progress["loss"][-1] < progress["loss"][0]
    report = json.loads((out / "report.json").read_text())
    assert len(report["held_out_agreement"]) == 2
    assert report["confidence_temperature"] in TEMPERATURES
    assert load_head(out).config.confidence_temperature == report["confidence_temperature"]
    shards = list((tmp_path / "cache" / "heads").rglob("shard_*.safetensors"))
    assert shards  # features cached for a rerun
    assert main(argv) == 0  # resumes: everything is done, nothing breaks
    target = load_model(str(model_dir), device="cpu", quantization="int8")
    drafter = load_head_drafter(target, str(out))
    assert len(load_head(out).vocab) == 512
    ids = target.tokenizer("def function_3(value_0):\n    value_1 = compute(", add_special_tokens=False)[
        "input_ids"
    ]
    cache = target.forward.new_cache()
    target.forward(ids[:-1], cache)
    drafter.attach(cache)
    assert len(drafter.propose_exactly(ids, 4).tokens) == 4

    # A new run may start from a trained head (``--init``), here under bf16 autocast: its first
    # epoch starts where the first run ended, not from random weights.
    again = tmp_path / "again"
    init_argv = [*argv[: argv.index("--out")], "--out", str(again), *argv[argv.index("--out") + 2 :]]
    init_argv += ["--init", str(out), "--precision", "bf16", "--epochs", "1"]
    assert main(init_argv) == 0
    assert json.loads((again / "progress.json").read_text())["loss"][0] < progress["loss"][0]
    assert torch.equal(load_head(again).vocab, load_head(out).vocab)
    shipped_argv = [a if a != str(again) else str(tmp_path / "third") for a in init_argv]
    shipped_argv[shipped_argv.index(str(out))] = "shipped"
    with pytest.raises(SystemExit, match="no head ships"):  # none is shipped for the tiny model
        main(shipped_argv)
    with pytest.raises(SystemExit, match="--init"):  # nothing to calibrate
        main([*argv, "--epochs", "0"])


def test_per_batch_features_are_the_cached_shards_sequences_with_states_near_theirs(
    tmp_path, monkeypatch, default_tokenizer_folder
):
    """``--features batch`` (a GPU's way) trains on the very sequences the CPU's shards cache, in
    the same stream, and the dense model's states for them are the quantized forward's within
    its rounding: a head trained on one reads the other."""
    from speculative_complete.decoding.draft_head.features import BatchFeatures
    from speculative_complete.decoding.draft_head.training import Target, main, parse_args, training_source
    from tests.support.tiny_models import save_tiny_model

    monkeypatch.setenv("DECODING_CACHE_DIR", str(tmp_path / "cache"))
    model_dir = save_tiny_model(tmp_path / "tiny", default_tokenizer_folder, seed=3)
    target = Target.load(str(model_dir), "int8")
    corpus = write_corpus(tmp_path / "corpus", 40)
    argv = ["--model", str(model_dir), "--corpus", str(corpus), "--tokens", "3072", "--sequence", "64"]
    cached = training_source(parse_args([*argv, "--batch", "4"]), target, corpus)
    batch = training_source(parse_args([*argv, "--batch", "4", "--features", "batch"]), target, corpus)
    assert isinstance(batch, BatchFeatures) and batch.sequences() == cached.sequences() == 48
    assert torch.equal(torch.cat(list(cached.tokens())).long(), batch.ids)
    assert batch.steps() == cached.steps() == 12
    by_tokens = {}
    for tokens, hidden in cached.epoch(0):
        by_tokens.update({tuple(t.tolist()): h for t, h in zip(tokens, hidden, strict=True)})
    for tokens, hidden in batch.epoch(1):
        for t, h in zip(tokens, hidden, strict=True):
            want = by_tokens[tuple(t.tolist())]  # the shards hold fp16 states
            assert torch.nn.functional.cosine_similarity(h, want, dim=-1).min() > 0.999

    out = tmp_path / "head"
    argv += ["--quantization", "int8", "--held-out-tokens", "256", "--vocab", "512", "--out", str(out)]
    argv += ["--epochs", "3", "--batch", "4", "--depth", "2", "--lr", "3e-3", "--features", "batch"]
    assert main(argv) == 0
    progress = json.loads((out / "progress.json").read_text())
    assert progress["loss"][-1] < progress["loss"][0]
    report = json.loads((out / "report.json").read_text())
    assert report["trained_tokens"] == 48 * 64 and len(report["held_out_agreement"]) == 2

    # A lent GPU's few minutes: only the epochs that fit run, here the one under way.
    short = tmp_path / "short"
    argv = [*argv[: argv.index("--out")], "--out", str(short), *argv[argv.index("--out") + 2 :]]
    assert main([*argv, "--batch", "1", "--max-minutes", "0.0001"]) == 0
    assert json.loads((short / "progress.json").read_text())["epochs"] == 1
    assert json.loads((short / "report.json").read_text())["epochs"] == 1


def test_a_time_budget_keeps_the_epochs_that_fit():
    from speculative_complete.decoding.draft_head.training import epochs_that_fit

    # 100 steps of 0.1 s: 10 s an epoch, 6 in a minute
    assert epochs_that_fit(0.1, 100, 1.0, done=0, planned=4) == 4
    assert epochs_that_fit(0.1, 100, 1.0, done=0, planned=10) == 6
    assert epochs_that_fit(0.1, 100, 1.0, done=2, planned=10) == 8  # resumed: 6 more
    assert epochs_that_fit(0.1, 100, 0.05, done=3, planned=10) == 4  # the one under way, at least


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_train_head_on_cuda_trains_a_head_the_cpu_drafts_with(
    tmp_path, monkeypatch, default_tokenizer_folder
):
    """``--device cuda``: per-batch states on the GPU, training there, the report and the saved
    head on the CPU, where the server's drafter loads it."""
    from speculative_complete.decoding.draft_head.training import main
    from speculative_complete.decoding.models.loading import load_model
    from tests.support.tiny_models import save_tiny_model

    monkeypatch.setenv("DECODING_CACHE_DIR", str(tmp_path / "cache"))
    model_dir = save_tiny_model(tmp_path / "tiny", default_tokenizer_folder, seed=3)
    corpus = write_corpus(tmp_path / "corpus", 40)
    out = tmp_path / "head"
    argv = ["--model", str(model_dir), "--quantization", "int8", "--corpus", str(corpus), "--out", str(out)]
    argv += ["--tokens", "3072", "--held-out-tokens", "256", "--sequence", "64", "--vocab", "512"]
    argv += ["--epochs", "3", "--batch", "4", "--depth", "2", "--lr", "3e-3", "--device", "cuda"]
    assert main(argv) == 0
    progress = json.loads((out / "progress.json").read_text())
    assert progress["loss"][-1] < progress["loss"][0]
    target = load_model(str(model_dir), device="cpu", quantization="int8")
    ids = target.tokenizer("def function_3(value_0):\n    value_1 = compute(", add_special_tokens=False)[
        "input_ids"
    ]
    cache = target.forward.new_cache()
    target.forward(ids[:-1], cache)
    drafter = load_head_drafter(target, str(out))
    drafter.attach(cache)
    assert len(drafter.propose_exactly(ids, 4).tokens) == 4
