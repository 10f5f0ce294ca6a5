"""A fast smoke run of ``benchmarks/repo_quality.py`` on a two-file project with the tiny random
model: the cases it picks (lines that use another file's name), both prompts, the JSON; not its
numbers."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from benchmarks import quality, repo_quality
from speculative_complete.decoding import SpeculativeEngine, load_model
from speculative_complete.lsp_server.context import definitions
from speculative_complete.lsp_server.context.builder import ContextBuilder, ContextRequest
from speculative_complete.lsp_server.context.tokens import Tokens
from tests.support.lsp import tiny_model_dir, tokenizer_source

LIBRARY = (
    "".join(f"def settle_ledger_{i}(amount, rate):\n    return amount * rate + {i}\n\n\n" for i in range(4))
    + "class HarborClerk:\n    def tally(self, rows):\n        return len(rows)\n\n\nHARBOR_LIMIT = 40\n"
)
CALLER = (
    '"""Callers.\n\nsettle_ledger_0(docstring, not code)\n"""\nfrom library import settle_ledger_0\n\n\n'
    + "".join(f"def step_{i}(rows):\n    total = len(rows) * {i}\n    return total\n\n\n" for i in range(3))
    + "def run(rows):\n    value = settle_ledger_0(rows, 2)\n    clerk = HarborClerk()\n"
    + "    # settle_ledger_1(rows) in a comment\n    limit = HARBOR_LIMIT + 1\n    plain = rows + 1\n"
)


def project(tmp_path: Path) -> Path:
    root = tmp_path / "harbor"
    root.mkdir()
    (root / "library.py").write_text(LIBRARY)
    (root / "caller.py").write_text(CALLER)
    return root


def test_cases_are_code_lines_that_use_another_files_name(tmp_path):
    root = project(tmp_path)
    texts, table = repo_quality.scan(root)
    cases = repo_quality.sample_cases("harbor", texts, table, 10, 0)
    assert sorted(c.expected for c in cases) == [
        "clerk = HarborClerk()",
        "limit = HARBOR_LIMIT + 1",
        "value = settle_ledger_0(rows, 2)",
    ]  # not the docstring's or the comment's mention, not the plain line, not the import
    case = next(c for c in cases if c.expected.startswith("value"))
    assert case.text[case.offset - 4 : case.offset] == "    " and case.text[case.offset] == "\n"
    # what the cross-file prompt adds: the definition, found through the import
    tokens = Tokens.from_tokenizer(AutoTokenizer.from_pretrained(str(tokenizer_source())))
    uri = Path(case.file).as_uri()
    request = ContextRequest(case.text, case.offset, 512, uri=uri, language_id="python", symbols=table)
    (excerpt,) = ContextBuilder().build(request, tokens).snippets
    assert excerpt.kind == "definition" and excerpt.text.startswith("def settle_ledger_0(amount, rate):")
    assert not ContextBuilder().build(replace(request, cross_file=False), tokens).snippets
    assert repo_quality.definition_shown(tokens, 512, case, table)
    assert not repo_quality.definition_shown(tokens, 16, case, table)  # no room for definitions


def test_the_name_oracle_shows_the_definitions_of_the_lines_own_name_alone(tmp_path):
    root = project(tmp_path)
    texts, table = repo_quality.scan(root)
    cases = repo_quality.sample_cases("harbor", texts, table, 10, 0)
    case = next(c for c in cases if c.expected.startswith("limit"))
    tokens = Tokens.from_tokenizer(AutoTokenizer.from_pretrained(str(tokenizer_source())))
    uri = Path(case.file).as_uri()
    request = ContextRequest(case.text, case.offset, 512, uri=uri, language_id="python", symbols=table)
    shipped = {s.text.split("\n")[0] for s in ContextBuilder().build(request, tokens).snippets}
    assert "def settle_ledger_0(amount, rate):" in shipped  # the names near the cursor's
    builder, oracle = ContextBuilder(), repo_quality.NameOracle()
    builder.definitions = oracle
    oracle.name = repo_quality.cross_file_name(case.expected, Path(case.file), table) or ""
    (excerpt,) = builder.build(request, tokens).snippets
    assert oracle.name == "HARBOR_LIMIT" and excerpt.text == "HARBOR_LIMIT = 40"


def test_the_benchmark_runs_end_to_end_on_a_tiny_project(tmp_path):
    out = tmp_path / "repo_quality.json"
    result = repo_quality.main(
        [
            f"--projects={project(tmp_path)}",
            "--n=3",
            "--budget=128",
            "--max-new-tokens=4",
            "--keystroke-lines=1",
            f"--model={tiny_model_dir()}",
            "--cost-model=none",
            "--oracle",
            f"--out={out}",
        ]
    )
    saved = json.loads(out.read_text())
    assert saved["summary"] == json.loads(json.dumps(result["summary"]))
    row = saved["summary"]["all"]
    assert row["n"] == 3 and saved["summary"]["harbor"]["n"] == 3
    assert 0.0 <= saved["definition_shown"] <= 1.0
    for variant in (*repo_quality.VARIANTS, repo_quality.ORACLE):
        assert 0.0 <= row[variant]["exact"] <= 1.0 and 0 < row[variant]["prompt_tokens_mean"] <= 128
        assert row[variant]["line_log_prob"] < 0.0
    assert 0.0 <= row["log_prob_raised"] <= 1.0
    case = saved["cases"][0]["runs"]
    assert set(case) == {*repo_quality.VARIANTS, repo_quality.ORACLE}
    assert all(run["line_log_prob"] < 0.0 for run in case.values())
    share = saved["keystroke_prefix_share"]
    assert 0.5 < share["single_file"] <= 1.0 and 0.5 < share["cross_file"] <= 1.0


def test_the_line_log_prob_is_the_models_own_teacher_forced_mean():
    """Against transformers' forward over the prompt and the line in one pass: what the line's
    tokens score, from the first one past the text healing backed up over."""
    model_dir = tiny_model_dir()
    engine = SpeculativeEngine(load_model(str(model_dir), device="cpu", dtype="float32"))
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    cases = (
        ("def run(rows):\n    value =", "", " settle_ledger(rows, 2)\n"),
        ("def run(rows):\n", "   ", "    value = settle(rows)\n"),  # its first token: the 3 spaces
    )
    for before, healed, line in cases:
        prompt, ids = engine.encode(before), engine.encode(line)
        with torch.inference_mode():
            logits = reference(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
        picked = torch.log_softmax(logits.float(), -1)[torch.arange(len(ids)), torch.tensor(ids)]
        owed = 1 if healed and engine.decode(ids[:1]) == healed else 0
        got = quality.line_log_prob(engine, prompt, healed, line[len(healed) :].rstrip("\n"))
        assert abs(got - float(picked[owed:].mean())) < 1e-3
        assert owed == (healed != "")


FIM_AND_REPO_MARKERS = [
    "<|fim_prefix|>",
    "<|fim_suffix|>",
    "<|fim_middle|>",
    "<|fim_pad|>",
    "<|file_sep|>",
    "<|repo_name|>",
]


def layout_prompts(tokens: Tokens, root: Path) -> dict[str, str]:
    """The ``value = settle_ledger_0(...)`` case's prompt text per prompt of ``--layouts auto,qwen``."""
    texts, table = repo_quality.scan(root)
    cases = repo_quality.sample_cases("harbor", texts, table, 10, 0)
    case = next(c for c in cases if c.expected.startswith("value"))
    workspace = repo_quality.Workspace("harbor", root, table)
    out = {}
    for prompting in repo_quality.promptings(["auto", "qwen"]):
        request = repo_quality.request_for(case, 512, workspace, prompting)
        out[prompting.name] = tokens.decode(list(ContextBuilder().build(request, tokens).ids))
    return out


def test_layouts_give_cross_file_once_per_fim_template_and_single_file_the_shipped_one():
    assert [p.name for p in repo_quality.promptings(["auto"])] == list(repo_quality.VARIANTS)
    prompts = repo_quality.promptings(["auto", "qwen", "auto"])
    assert [(p.name, p.cross_file, p.fim_template) for p in prompts] == [
        ("single_file", False, "auto"),
        ("cross_file", True, "auto"),
        ("cross_file:qwen", True, "qwen"),
    ]


def test_the_repository_layout_shows_definitions_under_their_path_and_qwen_as_comments(tmp_path):
    """On a vocabulary with Qwen2.5-Coder's markers: ``auto`` is the repository layout, named by
    the workspace folder; ``qwen`` the plain FIM prompt with the same definition as a comment."""
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_source()))
    tokenizer.add_special_tokens({"additional_special_tokens": FIM_AND_REPO_MARKERS})
    prompts = layout_prompts(Tokens.from_tokenizer(tokenizer), project(tmp_path))
    definition = "def settle_ledger_0(amount, rate):"
    assert prompts["single_file"].startswith("<|repo_name|>harbor\n<|file_sep|>caller.py\n<|fim_prefix|>")
    assert definition not in prompts["single_file"]
    assert prompts["cross_file"].startswith(f"<|repo_name|>harbor\n<|file_sep|>library.py\n{definition}")
    assert "<|file_sep|>caller.py\n<|fim_prefix|>" in prompts["cross_file"]
    qwen = prompts["cross_file:qwen"]
    assert qwen.startswith("<|fim_prefix|># Compare this snippet from ") and f"\n# {definition}" in qwen
    assert "<|repo_name|>" not in qwen and "<|file_sep|>" not in qwen


def test_shards_merge_into_the_run_they_cut(tmp_path):
    """Two halves of a run (``--shard``), each decoding every other case, sum into the whole run's
    cases and figures (``--merge``); the timings aside."""
    root = project(tmp_path)
    common = [
        f"--projects={root}",
        "--n=3",
        "--budget=128",
        "--max-new-tokens=4",
        "--keystroke-lines=0",
        f"--model={tiny_model_dir()}",
        "--cost-model=none",
        "--layouts=auto,qwen",
    ]
    whole = repo_quality.main([*common, f"--out={tmp_path / 'whole.json'}"])
    for k in (0, 1):
        repo_quality.main([*common, f"--shard={k}/2", f"--out={tmp_path / f'half{k}.json'}"])
    halves = [json.loads((tmp_path / f"half{k}.json").read_text()) for k in (0, 1)]
    assert [len(h["cases"]) for h in halves] == [2, 1]
    merged = repo_quality.main(
        [
            "--merge",
            str(tmp_path / "half1.json"),
            str(tmp_path / "half0.json"),
            f"--out={tmp_path / 'm.json'}",
        ]
    )
    assert sorted(merged["shards"]) == ["0/2", "1/2"]
    assert json.loads((tmp_path / "m.json").read_text())["summary"] == json.loads(
        json.dumps(merged["summary"])
    )
    for group in ("all", "harbor"):
        for name in ("single_file", "cross_file", "cross_file:qwen"):
            got, want = merged["summary"][group][name], whole["summary"][group][name]
            for figure in ("exact", "exact_cases", "edit_similarity", "line_log_prob", "prompt_tokens_mean"):
                assert got[figure] == want[figure], (group, name, figure)
    row = merged["summary"]["all"]
    assert row["n"] == 3 and row["cross_file:qwen"]["gained"] + row["cross_file:qwen"]["lost"] >= 0
    assert row["exact_ratio"] == row["cross_file"]["exact_ratio"]
    with pytest.raises(SystemExit):
        repo_quality.main(["--merge", str(tmp_path / "half0.json"), str(tmp_path / "half0.json")])


def test_the_line_log_prob_fed_on_from_a_cache_is_the_one_from_a_fresh_prefill():
    """What ``Variants`` does with the generation's own cache (the prompt prefilled once): the
    same score as prefilling the prompt again."""
    engine = SpeculativeEngine(load_model(str(tiny_model_dir()), device="cpu", dtype="float32"))
    prompt, forward = engine.encode("def run(rows):\n    value ="), engine.target.forward
    fresh = quality.line_log_prob(engine, prompt, "", " settle_ledger(rows, 2)")
    for held in (1, len(prompt) - 1):
        cache = forward.new_cache()
        with torch.inference_mode():
            forward(prompt[:held], cache, keep=1)
        cached = quality.line_log_prob(engine, prompt, "", " settle_ledger(rows, 2)", cache, held)
        assert abs(cached - fresh) < 1e-3


@pytest.mark.real_model
def test_on_the_real_qwen_the_layouts_and_the_cached_log_prob(tmp_path):
    """The real Qwen2.5-Coder 0.5B (the 1.5B's vocabulary, a quarter of its load time): ``auto``
    is its repository layout, ``qwen`` the comments; and on its lean forward the log-prob fed on
    from the generation's cache is the fresh prefill's, bit for bit."""
    from benchmarks import real_models

    found = real_models.installed_path("qwen2.5-coder-0.5b")
    if found is None:
        pytest.skip("qwen2.5-coder-0.5b is not installed: python -m benchmarks.real_models --install")
    from speculative_complete.decoding.kv_cache import PrefixCache

    engine = SpeculativeEngine(load_model(str(found), device="cpu"), prefix_cache=PrefixCache(1 << 28))
    tokens = Tokens.for_engine(engine)
    root = project(tmp_path)
    prompts = layout_prompts(tokens, root)
    assert prompts["cross_file"].startswith("<|repo_name|>harbor\n<|file_sep|>library.py\n")
    assert prompts["cross_file:qwen"].startswith("<|fim_prefix|># Compare this snippet from ")
    texts, table = repo_quality.scan(root)
    case = next(c for c in repo_quality.sample_cases("harbor", texts, table, 10, 0) if "HARBOR" in c.expected)
    workspace, shipped = (
        repo_quality.Workspace("harbor", root, table),
        repo_quality.Prompting("cross_file", True),
    )
    request = repo_quality.request_for(case, 256, workspace, shipped)
    prompt = ContextBuilder().build(request, tokens)
    variants = quality.Variants(engine, 256, 8)
    run = variants.context(
        case, name="cross_file", uri=request.uri, log_prob=True, **workspace.options(shipped)
    )
    assert run.prompt_tokens == len(prompt.ids)
    assert engine.prefix_cache.stats.reused_tokens == len(prompt.ids) - 1  # the generation's cache
    assert run.line_log_prob == quality.line_log_prob(engine, prompt.ids, prompt.healed, case.expected)


def test_tweaks_change_the_choice_of_definitions_and_nothing_else(tmp_path):
    """``--tweaks``' what-ifs: a halved share is the shipped choice for half the budget; stubs give
    each bare header the body ``...``; no_modules drops a module's top-level definitions."""
    header = 'class Clerk:\n    def tally(self, rows):\n    x = 1\ndef run(a):\n    """Doc."""'
    assert repo_quality.stub(header) == header.replace("rows):", "rows): ...")
    (tweaked,) = repo_quality.promptings([], ["stubs+half_share"])[1:]
    assert tweaked.name == "cross_file+stubs+half_share" and tweaked.tweaks == ("stubs", "half_share")
    with pytest.raises(SystemExit):
        repo_quality.promptings(["auto"], ["bigger"])
    root = project(tmp_path)
    _, table = repo_quality.scan(root)
    uri, names, cost = (root / "caller.py").as_uri(), ["HarborClerk", "library", "settle_ledger_0"], len
    whole = definitions.Project(table)
    shipped = definitions.choose(whole, uri, names, cost, 400)
    assert repo_quality.Tweaked(["half_share"]).choose(whole, uri, names, cost, 400) == definitions.choose(
        whole, uri, names, cost, 200
    )
    stubs = repo_quality.Tweaked(["stubs"]).choose(whole, uri, names, cost, 400)
    assert [s.text for s in stubs] == [repo_quality.stub(s.text) for s in shipped]
    assert "    def tally(self, rows): ..." in stubs[0].text
    assert "def settle_ledger_3(amount, rate):" in shipped[0].text  # the module ``library``'s
    alone = repo_quality.Tweaked(["no_modules"]).choose(whole, uri, names, cost, 400)
    assert "settle_ledger_3" not in alone[0].text and "def settle_ledger_0(amount, rate):" in alone[0].text
