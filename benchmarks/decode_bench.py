"""Decode-speed benchmark: speculative decoding vs plain greedy and transformers' own peers.

Why this shape:

* Real code, real model. Prompts are cut from the Python standard library (found through
  ``sysconfig``, files picked with a seeded RNG) and decoded by the embedded SmolLM2 model, the
  case the completion server serves: one rest-of-line suggestion after ~450 tokens of context.
* Two slices, because speculation pays very differently on them. ``cold``: ordinary cursor
  positions, where the line to write rarely appears earlier. ``repeat``: the prompt holds a block
  of the file and then the same block again up to the cursor (a copy-paste-edit, or the second
  half of a file whose first half is in view), so the rest of the line is in the prompt.
* Every method decodes the same prompt before the next prompt starts (interleaved, the order
  of all but the plain reference rotated per prompt), so load from other processes on a shared
  machine hits all methods alike; speed is only ever reported as a ratio against plain greedy
  measured in the same run, never as an absolute promise. ``--repeats R`` runs R such rounds
  per prompt and keeps each method's fastest, for machines whose load spikes hit single runs.
* Greedy speculative decoding is lossless, so each method's tokens are checked against plain
  greedy's and mismatches are counted: a fast wrong answer is a bug, not a win.
* "Decode" is the time a method spends beyond reading the prompt, measured the same way for
  every method: its total minus plain greedy's prefill of the same prompt in the same run.
  transformers' ``generate`` has no prefill/decode split, and the engine verifies its first draft
  inside the prefill pass (a few more rows of a pass that runs anyway), so its own prefill/decode
  split would flatter it; the engine's own ``decode_ms`` is kept in the JSON as
  ``engine_decode_ms``. A whole line can come out of the prefill, so this decode time can be
  near zero or even negative (within the prefill's noise): ratios are of medians, and the
  per-prompt geometric means floor each decode time at ``DECODE_FLOOR_MS``.
* The engine prefills the prompt in one pass here, as ``generate`` does, so every method's
  prefill is the same work. (The server prefills in passes sized to take
  ``speculative_complete.decoding.engine.pacing``'s target time, so that a keystroke can cancel
  between them; each extra pass streams the weights once more, ~35 ms on the 2-core CPU, which would
  otherwise be charged to the peers' decode time.)
* A prompt ends at the cursor, often inside a token (``self.va|lue``) or after an indentation
  the next word's token would have begun with. The server heals such a cut: it backs the prompt
  up to a token boundary and makes the output begin with the text it removed. ``--heal`` does
  the same for every engine method (transformers' peers cannot: it runs without them). The
  default stays the raw cut, which every figure before 2026-11-26 used. A draft head, trained on
  whole files' own tokens, guesses far worse after a raw cut (its first draft after the prefill
  agreed 0.18 of the time against 0.40 healed, on 40 cold prompts), but unsure there it mostly
  does not draft: healed, the cold slice's figures came out the same (benchmarks/README.md).

Run ``python -m benchmarks.decode_bench --help``; see ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import random
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers

from speculative_complete.decoding import (
    GenerationConfig,
    GenerationResult,
    LoadedModel,
    SpeculativeEngine,
    load_model,
)
from speculative_complete.decoding.drafters import Drafter, load_head_drafter, make_drafter
from speculative_complete.decoding.engine.healing import back_up
from speculative_complete.decoding.models.loading import QUANTIZATIONS, check_draft_compatible

log = logging.getLogger("benchmarks.decode_bench")

SLICES = ("cold", "repeat")
PROMPT_LOOKUP_TOKENS = 10
ONE_PASS = 1 << 20  # prefill_chunk: the whole prompt in one pass, like generate()
DECODE_FLOOR_MS = 5.0  # per-prompt ratios: a decode time below this (or negative) counts as this
# Source lines whose rest (after the cursor) is shorter than this many tokens are not used: the
# cold slice wants a line worth completing, the repeat slice a copy long enough to draft from.
MIN_REST_TOKENS = {"cold": 4, "repeat": 8}
REPEAT_LINES_AFTER = 3  # the first copy of the block runs this many lines past the cursor line
# Tests, installed packages, and generated data (codec tables, pydoc's topic strings): the last are
# so repetitive that they would flatter prompt lookup on what should be ordinary code.
SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "__pycache__", "encodings", "pydoc_data"}
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "decode_bench.json"


# -- prompts -------------------------------------------------------------------------------------
@dataclass
class Prompt:
    """One benchmark case: tokens before a cursor in a stdlib file, and the line's real rest."""

    slice: str
    file: str  # relative to the stdlib directory
    line: int  # 1-based line number of the cursor line in the file
    column: int  # cursor column, in characters
    cursor: str  # "line_start" (after the indentation) or "mid_line"
    token_ids: list[int]
    expected: str  # the rest of the line in the source: what a perfect completion would write


def stdlib_files() -> list[tuple[str, Path]]:
    """Every non-test ``.py`` file of the running interpreter's stdlib that the draft head was not
    trained on (``speculative_complete.decoding.draft_head.training.held_out``), in a stable order."""
    from speculative_complete.decoding.draft_head.training import held_out

    root = Path(sysconfig.get_paths()["stdlib"])
    found = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if SKIP_DIRS.isdisjoint(rel.parts[:-1]) and held_out(rel.as_posix()):
            found.append((rel.as_posix(), path))
    found.sort()
    if not found:
        raise RuntimeError(f"no Python files found under the stdlib directory {root}")
    return found


class PromptSource:
    """An endless, deterministic stream of prompts for one slice.

    Candidates are drawn with ``random.Random(f"{seed}:{slice}")`` so the slices do not share
    (or shift) each other's draws, and a prompt is the same in every run on the same Python.
    """

    def __init__(
        self,
        engine: SpeculativeEngine,
        files: Sequence[tuple[str, Path]],
        slice_name: str,
        prompt_tokens: int,
        seed: int,
    ) -> None:
        if slice_name not in SLICES:
            raise ValueError(f"unknown slice {slice_name!r}; choose from {', '.join(SLICES)}")
        self.engine, self.files, self.slice = engine, files, slice_name
        self.prompt_tokens = prompt_tokens
        self.rng = random.Random(f"{seed}:{slice_name}")
        self._texts: dict[str, list[str]] = {}
        self._used: set[tuple[str, int]] = set()

    def _lines(self, rel: str, path: Path) -> list[str]:
        if rel not in self._texts:
            try:
                text = path.read_text(encoding="utf-8", errors="replace")
                self._texts[rel] = text.splitlines(keepends=True)
            except OSError:
                self._texts[rel] = []
        return self._texts[rel]

    def __iter__(self) -> Iterator[Prompt]:
        attempts = 0
        while True:
            attempts += 1
            if attempts > 200_000:
                raise RuntimeError(f"could not find enough {self.slice} prompts in the stdlib")
            prompt = self._candidate()
            if prompt is not None:
                yield prompt

    def _candidate(self) -> Prompt | None:
        rel, path = self.rng.choice(self.files)
        lines = self._lines(rel, path)
        if len(lines) < 40:
            return None
        index = self.rng.randrange(10, len(lines))
        line = lines[index]
        content = line.strip()
        if not content or (rel, index) in self._used or "\r" in line.rstrip("\r\n"):
            return None
        indent = len(line) - len(line.lstrip())
        end = len(line.rstrip("\r\n"))
        mid_line = self.rng.random() < 0.5
        column = self.rng.randrange(indent + 1, end) if mid_line and end - indent > 1 else indent
        expected = line[column:end]
        if len(self.engine.encode(expected)) < MIN_REST_TOKENS[self.slice]:
            return None
        offset = sum(len(x) for x in lines[:index]) + column
        text = "".join(lines)
        if self.slice == "cold":
            ids = self._cold(text, offset)
        else:
            ids = self._repeat(lines, index, text, offset)
        if ids is None:
            return None
        self._used.add((rel, index))
        return Prompt(
            self.slice, rel, index + 1, column, "mid_line" if column > indent else "line_start", ids, expected
        )

    def _cold(self, text: str, cursor: int) -> list[int] | None:
        """The last ``prompt_tokens`` tokens of the text before the cursor (cut at the token level)."""
        ids = self.engine.encode(text[max(0, cursor - 10 * self.prompt_tokens) : cursor])
        return ids[-self.prompt_tokens :] if len(ids) >= self.prompt_tokens else None

    def _repeat(self, lines: list[str], index: int, text: str, cursor: int) -> list[int] | None:
        """A block ending a few lines past the cursor line, a blank line, then the block again up to
        the cursor; the block starts at a line far enough up that the whole is ``prompt_tokens``."""
        block_end = sum(len(x) for x in lines[: index + 1 + REPEAT_LINES_AFTER])
        start = sum(len(x) for x in lines[: index + 1])  # moves up one line at a time
        for first in range(index, -1, -1):
            start -= len(lines[first])
            block = text[start:block_end]
            separator = "\n" if block.endswith("\n") else "\n\n"  # one blank line between the copies
            ids = self.engine.encode(block + separator + text[start:cursor])
            if len(ids) >= self.prompt_tokens:
                return ids[-self.prompt_tokens :]
        return None


# -- records ------------------------------------------------------------------------------------
@dataclass
class MethodRun:
    """One method on one prompt."""

    method: str
    total_ms: float  # wall time of the whole call: prefill + decode (+ generate()'s own overhead)
    decode_ms: float  # total_ms - plain greedy's fastest prefill_ms on this prompt, for every method
    prefill_ms: float | None  # engine methods only: the engine's own split
    engine_decode_ms: float | None  # engine methods only: stats.decode_ms (after the prefill pass)
    produced_tokens: int
    matches_plain: bool
    stop_reason: str
    target_passes: int | None = None  # engine methods only; the prefill counts as one
    tokens_per_pass: float | None = None
    after_prefill: tuple[int, int] | None = None  # engine methods only: (tokens, passes) after it
    proposed: int = 0
    accepted: int = 0
    drafters: dict[str, dict[str, Any]] = field(default_factory=dict)
    total_ms_all: list[float] = field(default_factory=list)  # every timed run (--repeats); the fastest kept


@dataclass
class PromptRecord:
    """A prompt, where it came from, plain greedy's answer and every method's run on it."""

    slice: str
    index: int
    file: str
    line: int
    column: int
    cursor: str
    prompt_tokens: int
    prompt_tail: str  # the last characters before the cursor, to eyeball the case
    expected: str
    plain_text: str
    exact: bool  # plain greedy wrote exactly the rest of the source line
    order: list[str] = field(default_factory=list)  # the order the methods ran in
    runs: dict[str, MethodRun] = field(default_factory=dict)


# -- running methods ----------------------------------------------------------------------------
class Bench:
    """Holds the models, the engine and one drafter per method for the whole run, so drafters
    learn acceptance statistics across prompts the way they do in a long-lived server."""

    def __init__(
        self,
        target: LoadedModel,
        draft: LoadedModel | None,
        *,
        max_new_tokens: int,
        peers: bool,
        draft_head: str = "auto",
        heal: bool = False,
    ) -> None:
        self.target, self.draft, self.heal = target, draft, heal
        self.engine = SpeculativeEngine(target)
        self.config = GenerationConfig(
            max_new_tokens=max_new_tokens, stop_at_newline=True, prefill_chunk=ONE_PASS, prefill_ms=None
        )
        self.drafters: dict[str, Drafter | None] = {"plain": None}
        self.drafters["ngram"] = make_drafter("ngram", cost=self.engine.cost)
        if draft is not None:
            self.drafters["model"] = make_drafter("model", draft_model=draft, cost=self.engine.cost)
        cost = self.engine.cost
        head = load_head_drafter(target, draft_head, cost=cost)
        if head is not None:  # the shipped draft head alone, and auto with and without it
            self.drafters["head"] = make_drafter("head", draft_head=head, cost=cost)
            self.drafters["auto_no_head"] = make_drafter("auto", draft_model=draft, cost=cost)
            head = load_head_drafter(target, draft_head, cost=cost)  # auto's own, with its own statistics
        self.drafters["auto"] = make_drafter("auto", draft_model=draft, draft_head=head, cost=cost)
        self.peers: dict[str, dict[str, Any]] = {}
        if peers:
            self.peers["hf_greedy"] = {}
            self.peers["hf_prompt_lookup"] = {"prompt_lookup_num_tokens": PROMPT_LOOKUP_TOKENS}
            if draft is not None and draft.model is not None:  # transformers' draft, not a graphed one
                self.peers["hf_assisted"] = {"assistant_model": draft.model}
        pad = getattr(target.tokenizer, "pad_token_id", None)
        eos = sorted(target.end_token_ids)
        self.pad_token_id = pad if pad is not None else (eos[0] if eos else 0)  # silences generate()

    @property
    def methods(self) -> list[str]:
        return list(self.drafters) + list(self.peers)

    def healed(self, prompt: Prompt) -> Prompt:
        """``prompt`` as the engine methods will decode it: with ``heal``, backed up to a token
        boundary as the server does (``speculative_complete.decoding.engine.healing.back_up``), the
        text it removed being what every method's output must begin with (``self.config``), else as
        cut."""
        if not self.heal:
            return prompt
        ids = prompt.token_ids
        cut = back_up(ids, self.engine.decode(ids), self.engine.decode, self.engine.healing_index)
        self.config = replace(self.config, required_prefix=cut.removed)
        return replace(prompt, token_ids=cut.ids)

    def run_plain(self, ids: list[int]) -> tuple[GenerationResult, float]:
        return self._timed_engine(ids, None)

    def _timed_engine(self, ids: list[int], drafter: Drafter | None) -> tuple[GenerationResult, float]:
        started = time.perf_counter()
        result = self.engine.generate(ids, self.config, drafter)
        return result, (time.perf_counter() - started) * 1000

    def engine_record(
        self,
        method: str,
        timed: Sequence[tuple[GenerationResult, float]],
        plain: GenerationResult,
        prefill_ms: float,
    ) -> MethodRun:
        """The fastest of a method's runs on one prompt; a mismatch in any run counts."""
        result, total_ms = min(timed, key=lambda t: t[1])
        stats = result.stats
        per = {
            name: {"drafts": s.drafts, "proposed": s.proposed, "accepted": s.accepted}
            for name, s in stats.drafters.items()
        }
        return MethodRun(
            method=method,
            total_ms=total_ms,
            decode_ms=total_ms - prefill_ms,
            prefill_ms=stats.prefill_ms,
            engine_decode_ms=stats.decode_ms,
            produced_tokens=stats.produced_tokens,
            matches_plain=all(r.token_ids == plain.token_ids and r.text == plain.text for r, _ in timed),
            stop_reason=result.stop_reason,
            target_passes=stats.target_passes,
            tokens_per_pass=stats.tokens_per_pass,
            after_prefill=stats.after_prefill,
            proposed=sum(s.proposed for s in stats.drafters.values()),
            accepted=sum(s.accepted for s in stats.drafters.values()),
            drafters=per,
            total_ms_all=[t for _, t in timed],
        )

    def peer_tokens(self, method: str, ids: list[int], max_new_tokens: int) -> tuple[list[int], float]:
        x = torch.tensor([ids], dtype=torch.long, device=self.target.device)
        started = time.perf_counter()
        with torch.inference_mode():
            out = self.target.model.generate(
                x,
                attention_mask=torch.ones_like(x),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=self.pad_token_id,
                **self.peers[method],
            )
        total_ms = (time.perf_counter() - started) * 1000
        return out[0, len(ids) :].tolist(), total_ms

    def _peer_matches(self, tokens: list[int], plain: GenerationResult) -> tuple[bool, str]:
        eos = self.target.end_token_ids
        cut = next((i for i, t in enumerate(tokens) if t in eos), len(tokens))
        text = self.engine.decode(tokens[:cut]).split("\n", 1)[0]
        kept = plain.token_ids
        return tokens[: len(kept)] == kept and text == plain.text, "eos" if cut < len(
            tokens
        ) else "max_tokens"

    def peer_record(
        self,
        method: str,
        timed: Sequence[tuple[list[int], float]],
        plain: GenerationResult,
        prefill_ms: float,
    ) -> MethodRun:
        """The fastest of a peer's runs, its decode time measured against the engine's plain prefill."""
        tokens, total_ms = min(timed, key=lambda t: t[1])
        checks = [self._peer_matches(t, plain) for t, _ in timed]
        return MethodRun(
            method=method,
            total_ms=total_ms,
            decode_ms=total_ms - prefill_ms,
            prefill_ms=None,
            engine_decode_ms=None,
            produced_tokens=len(tokens),
            matches_plain=all(ok for ok, _ in checks),
            stop_reason=checks[0][1],
            total_ms_all=[t for _, t in timed],
        )

    def run_prompt(
        self, prompt: Prompt, number: int, first_plain: tuple[GenerationResult, float], repeats: int = 1
    ) -> PromptRecord:
        """Every method on one prompt, ``repeats`` rounds, keeping each method's fastest run.

        Plain runs first (its first result is the reference and fixes the peers' token count);
        the rest follow in an order rotated by ``number``. Peers generate exactly as many tokens
        as plain greedy produced (the stopping token included), so every method writes the same
        tokens. A peer's decode time is its total minus the fastest plain prefill here.
        """
        ids = prompt.token_ids
        plain = first_plain[0]
        others = [m for m in self.methods if m != "plain"]
        shift = number % len(others) if others else 0
        order = others[shift:] + others[:shift]
        engine_runs: dict[str, list[tuple[GenerationResult, float]]] = {"plain": [first_plain]}
        peer_runs: dict[str, list[tuple[list[int], float]]] = {}
        for round_ in range(repeats):
            if round_:
                engine_runs["plain"].append(self.run_plain(ids))
            for method in order:
                if method in self.peers:
                    run = self.peer_tokens(method, ids, plain.stats.produced_tokens)
                    peer_runs.setdefault(method, []).append(run)
                else:
                    engine_runs.setdefault(method, []).append(self._timed_engine(ids, self.drafters[method]))
        prefill_ms = min(r.stats.prefill_ms for r, _ in engine_runs["plain"])
        text = self.engine.decode(ids)
        record = PromptRecord(
            slice=prompt.slice,
            index=number,
            file=prompt.file,
            line=prompt.line,
            column=prompt.column,
            cursor=prompt.cursor,
            prompt_tokens=len(ids),
            prompt_tail=text[-80:],
            expected=prompt.expected,
            plain_text=plain.text,
            exact=plain.text == prompt.expected,
            order=["plain", *order],
        )
        for method in record.order:
            if method in peer_runs:
                record.runs[method] = self.peer_record(method, peer_runs[method], plain, prefill_ms)
            else:
                record.runs[method] = self.engine_record(method, engine_runs[method], plain, prefill_ms)
        return record

    def warm_up(self, prompt: Prompt) -> None:
        """One untimed generation per method: first-call allocations, lazy inits, thread pools."""
        plain, _ = self.run_plain(prompt.token_ids)
        for method in self.methods:
            if method == "plain":
                continue
            if method in self.peers:
                self.peer_tokens(method, prompt.token_ids, max(plain.stats.produced_tokens, 2))
            else:
                self.engine.generate(prompt.token_ids, self.config, self.drafters[method])


# -- summary ------------------------------------------------------------------------------------
def _pct(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def _geomean(ratios: Sequence[float]) -> float | None:
    good = [r for r in ratios if r > 0 and math.isfinite(r)]
    return math.exp(sum(math.log(r) for r in good) / len(good)) if good else None


def _floored(decode_ms: float) -> float:
    return max(decode_ms, DECODE_FLOOR_MS)


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den is not None and den > 0 else None


def _summed_ratio(pairs: Sequence[tuple[int, int]]) -> float | None:
    """sum(numerators) / sum(denominators): a pass-weighted mean, so short decodes weigh little."""
    return _ratio(sum(n for n, _ in pairs), sum(d for _, d in pairs)) if pairs else None


def summarize(records: Sequence[PromptRecord], methods: Sequence[str]) -> dict[str, Any]:
    """Per method: medians and p95s, tokens per pass, acceptance, and speed ratios against plain
    greedy (and against transformers' plain generate) measured on the same prompts in this run.

    Per-prompt decode ratios floor each decode time at ``DECODE_FLOOR_MS``: a line that came out
    of the prefill leaves a decode time within the prefill's noise, even below zero.
    """
    out: dict[str, Any] = {}
    by_method = {m: [r.runs[m] for r in records if m in r.runs] for m in methods}
    plain = by_method.get("plain", [])
    plain_dec = _pct([r.decode_ms for r in plain], 50)
    plain_tot = _pct([r.total_ms for r in plain], 50)
    hf = by_method.get("hf_greedy", [])
    hf_tot = _pct([r.total_ms for r in hf], 50)
    for method, runs in by_method.items():
        if not runs:
            continue
        decode = [r.decode_ms for r in runs]
        total = [r.total_ms for r in runs]
        proposed = sum(r.proposed for r in runs)
        accepted = sum(r.accepted for r in runs)
        sources: dict[str, dict[str, int]] = {}
        for run in runs:
            for name, s in run.drafters.items():
                agg = sources.setdefault(name, {"drafts": 0, "proposed": 0, "accepted": 0})
                for key in agg:
                    agg[key] += s[key]
        pairs = [
            (rec.runs["plain"], rec.runs[method])
            for rec in records
            if method in rec.runs and "plain" in rec.runs
        ]
        entry: dict[str, Any] = {
            "n": len(runs),
            "mismatches": sum(not r.matches_plain for r in runs),
            "decode_ms_median": _pct(decode, 50),
            "decode_ms_p95": _pct(decode, 95),
            "total_ms_median": _pct(total, 50),
            "total_ms_p95": _pct(total, 95),
            "produced_tokens_mean": sum(r.produced_tokens for r in runs) / len(runs),
            "tokens_per_pass_mean": (
                sum(r.tokens_per_pass for r in runs if r.tokens_per_pass is not None) / len(runs)
            )
            if runs[0].tokens_per_pass is not None
            else None,
            # summed over the prompts: the drafters' own figure, the prompt's pass left out
            "tokens_per_pass_after_prefill": _summed_ratio(
                [r.after_prefill for r in runs if r.after_prefill is not None]
            ),
            "acceptance": accepted / proposed if proposed else None,
            "proposed": proposed,
            "accepted": accepted,
            "by_source": sources,
            "x_plain_decode_median": _ratio(plain_dec, _pct(decode, 50)),
            "x_plain_decode_geomean": _geomean(
                [_floored(p.decode_ms) / _floored(m.decode_ms) for p, m in pairs]
            ),
            "x_plain_total_median": _ratio(plain_tot, _pct(total, 50)),
            "x_plain_total_geomean": _geomean([p.total_ms / m.total_ms for p, m in pairs]),
        }
        if hf:
            hf_pairs = [
                (rec.runs["hf_greedy"], rec.runs[method])
                for rec in records
                if method in rec.runs and "hf_greedy" in rec.runs
            ]
            entry["x_hf_greedy_total_median"] = _ratio(hf_tot, _pct(total, 50))
            entry["x_hf_greedy_total_geomean"] = _geomean([h.total_ms / m.total_ms for h, m in hf_pairs])
        out[method] = entry
    return out


def check_targets(
    summary: dict[str, dict[str, Any]], records: Sequence[PromptRecord]
) -> list[dict[str, Any]]:
    """The goals from the issue, each with what this run observed (ratios of medians, and the
    per-prompt geometric mean where the two methods ran on the same prompts)."""
    checks = []

    def pair_geo(slice_name: str, fast: str, slow: str, key: str) -> float | None:
        def value(run: MethodRun) -> float:
            return _floored(run.decode_ms) if key == "decode_ms" else run.total_ms

        return _geomean(
            [
                value(r.runs[slow]) / value(r.runs[fast])
                for r in records
                if r.slice == slice_name and fast in r.runs and slow in r.runs
            ]
        )

    for slice_name, methods in summary.items():
        auto, plain, hfpl = methods.get("auto"), methods.get("plain"), methods.get("hf_prompt_lookup")
        if auto and plain:
            checks.append(
                {
                    "slice": slice_name,
                    "goal": "auto not slower than plain (decode)",
                    "need": 1.0,
                    "median": auto["x_plain_decode_median"],
                    "geomean": auto["x_plain_decode_geomean"],
                }
            )
            if slice_name == "repeat":
                checks.append(
                    {
                        "slice": slice_name,
                        "goal": "auto >= 2.5x plain (decode)",
                        "need": 2.5,
                        "median": auto["x_plain_decode_median"],
                        "geomean": auto["x_plain_decode_geomean"],
                    }
                )
        if auto and hfpl:
            for key, label in (("decode_ms", "decode"), ("total_ms", "total")):
                med = _ratio(hfpl[f"{key}_median"], auto[f"{key}_median"])
                checks.append(
                    {
                        "slice": slice_name,
                        "goal": f"auto >= 1.5x hf_prompt_lookup ({label})",
                        "need": 1.5,
                        "median": med,
                        "geomean": pair_geo(slice_name, "auto", "hf_prompt_lookup", key),
                    }
                )
    for check in checks:
        check["met"] = check["median"] is not None and check["median"] >= check["need"]
    return checks


# -- output -------------------------------------------------------------------------------------
def _f(value: float | None, spec: str = ".0f") -> str:
    return "-" if value is None else format(value, spec)


def format_tables(
    summary: dict[str, dict[str, Any]],
    targets: list[dict[str, Any]],
    skipped: dict[str, int],
    exact: dict[str, float],
) -> str:
    head = (
        f"{'method':<17}{'n':>4}{'mism':>5}{'dec med':>9}{'dec p95':>9}{'tot med':>9}{'tot p95':>9}"
        f"{'tok/pass':>9}{'aft pf':>8}{'accept':>8}{'x plain':>9}{'x pl geo':>9}{'x plain':>9}{'x hf':>7}"
    )
    sub = (
        f"{'':<17}{'':>4}{'':>5}{'ms':>9}{'ms':>9}{'ms':>9}{'ms':>9}"
        f"{'':>9}{'':>8}{'':>8}{'decode':>9}{'decode':>9}{'total':>9}{'total':>7}"
    )
    lines = []
    for slice_name, methods in summary.items():
        lines.append(
            f"\n== slice {slice_name}: plain greedy exact on {exact.get(slice_name, 0):.0%} "
            f"of lines; {skipped.get(slice_name, 0)} candidate prompt(s) replaced "
            f"(plain greedy wrote too little)"
        )
        lines += [head, sub]
        for method, s in methods.items():
            star = " "
            lines.append(
                f"{method:<17}{s['n']:>4}{s['mismatches']:>5}{_f(s['decode_ms_median']):>8}{star}"
                f"{_f(s['decode_ms_p95']):>8}{star}{_f(s['total_ms_median']):>9}{_f(s['total_ms_p95']):>9}"
                f"{_f(s['tokens_per_pass_mean'], '.2f'):>9}"
                f"{_f(s['tokens_per_pass_after_prefill'], '.2f'):>8}{_f(s['acceptance'], '.0%'):>8}"
                f"{_f(s['x_plain_decode_median'], '.2f'):>9}{_f(s['x_plain_decode_geomean'], '.2f'):>9}"
                f"{_f(s['x_plain_total_median'], '.2f'):>9}{_f(s.get('x_hf_greedy_total_median'), '.2f'):>7}"
            )
    lines.append(
        "\ndecode = total - plain greedy's prefill of the same prompt in this run, for every "
        "method (the engine verifies its first draft inside the prefill pass)."
    )
    lines.append(
        "x plain = plain median / method median; x pl geo = per-prompt geometric mean; "
        "x hf = hf_greedy median total / method median total."
    )
    if targets:
        lines.append("\ngoals:")
        for t in targets:
            lines.append(
                f"  [{'met' if t['met'] else 'NOT MET'}] {t['slice']}: {t['goal']}: median ratio "
                f"{_f(t['median'], '.2f')}, per-prompt geomean {_f(t['geomean'], '.2f')}"
            )
    return "\n".join(lines)


def environment(target: LoadedModel, draft: LoadedModel | None) -> dict[str, Any]:
    try:
        commit = (
            subprocess.run(
                ["git", "rev-parse", "HEAD"],
                capture_output=True,
                text=True,
                timeout=5,
                cwd=Path(__file__).resolve().parent,
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": str(target.device),
        "target_dtype": str(target.dtype),
        "target_source": target.source,
        "draft_dtype": str(draft.dtype) if draft else None,
        "stdlib": sysconfig.get_paths()["stdlib"],
        "git_commit": commit,
        "loadavg_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def write_json(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def plot(path: Path, summary: dict[str, dict[str, Any]]) -> Path | None:
    """A bar chart of decode speed-up over plain greedy, if matplotlib happens to be installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    slices = list(summary)
    methods = [m for m in dict.fromkeys(m for s in summary.values() for m in s) if m != "plain"]
    fig, ax = plt.subplots(figsize=(1.2 + 1.3 * len(methods) * max(len(slices), 1) / 2, 4))
    width = 0.8 / max(len(slices), 1)
    for i, slice_name in enumerate(slices):
        values = [summary[slice_name].get(m, {}).get("x_plain_decode_median") or 0.0 for m in methods]
        ax.bar([j + i * width for j in range(len(methods))], values, width, label=slice_name)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks([j + width * (len(slices) - 1) / 2 for j in range(len(methods))], methods, rotation=20)
    ax.set_ylabel("decode speed-up vs plain greedy (median)")
    ax.set_title("decode = total - plain greedy's prefill of the same prompt", fontsize=9)
    ax.legend()
    fig.tight_layout()
    out = path.with_suffix(".png")
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


# -- main ---------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.decode_bench", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--n", type=int, default=50, help="generations per slice (default 50)")
    parser.add_argument("--slices", default=",".join(SLICES), help="comma-separated: cold,repeat")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--prompt-tokens", type=int, default=448, help="tokens before the cursor")
    parser.add_argument(
        "--no-draft-model",
        action="store_true",
        help="skip the bf16 draft model (no model and hf_assisted; auto uses n-grams only)",
    )
    parser.add_argument("--no-peers", action="store_true", help="skip transformers' generate() peers")
    parser.add_argument(
        "--heal",
        action="store_true",
        help="heal each prompt's cut at the cursor as the server does (no transformers peers then)",
    )
    parser.add_argument(
        "--min-new-tokens",
        type=int,
        default=1,
        help="replace a prompt where plain greedy returns fewer tokens (default 1: it "
        "wrote nothing, so there is no decode to time)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="rounds of every method per prompt, keeping each one's fastest (a shared "
        "machine's load spikes hit single runs)",
    )
    parser.add_argument("--model", default="default", help="target model (load_model spec)")
    parser.add_argument(
        "--quantization",
        default="auto",
        choices=QUANTIZATIONS,
        help="the target's weights (default auto: the GGUF's own blocks on the lean forward; "
        "none: dequantized fp32, on the lean forward's dense layers)",
    )
    parser.add_argument(
        "--transformers-forward",
        action="store_true",
        help="run the target on transformers' own forward (what transformers' peers need; with "
        "--quantization none)",
    )
    parser.add_argument(
        "--draft-head",
        default="auto",
        help="the head of the head methods, as the draftHead setting (default auto: the shipped one)",
    )
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, ... (default auto)")
    parser.add_argument(
        "--dtype",
        default="float32",
        help="the target's dtype off the CPU's quantized forward (default float32; bfloat16 on a GPU)",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON output (default {DEFAULT_OUT})")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    args.slices = [s.strip() for s in args.slices.split(",") if s.strip()]
    unknown = [s for s in args.slices if s not in SLICES]
    if unknown or not args.slices:
        parser.error(f"--slices: unknown {unknown}; choose from {', '.join(SLICES)}")
    if min(args.n, args.max_new_tokens, args.repeats) < 1 or args.prompt_tokens < 16:
        parser.error("--n, --max-new-tokens and --repeats must be >= 1, --prompt-tokens >= 16")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()

    started = time.perf_counter()
    target = load_model(
        args.model,
        device=args.device,
        dtype=args.dtype,
        quantization=args.quantization,
        transformers_forward=args.transformers_forward,
    )
    in_transformers = target.model is not None  # the peers need it
    draft = None
    if not args.no_draft_model and (in_transformers or target.device.type != "cpu"):
        # on CUDA graphed as the server loads a draft model (a one-row step); else transformers'
        graphed = target.device.type == "cuda"
        quantization = "auto" if graphed else "none"
        draft = load_model(
            args.model, device=args.device, dtype="bfloat16", quantization=quantization, draft=True
        )
        check_draft_compatible(target, draft)
    log.info("models loaded in %.1f s (%s weights)", time.perf_counter() - started, target.quantization)
    peers = not args.no_peers and in_transformers
    bench = Bench(
        target,
        draft,
        max_new_tokens=args.max_new_tokens,
        peers=peers and not args.heal,
        draft_head=args.draft_head,
        heal=args.heal,
    )
    log.info("methods: %s", ", ".join(bench.methods))
    files = stdlib_files()

    warm = next(iter(PromptSource(bench.engine, files, "cold", args.prompt_tokens, args.seed + 10_000)))
    log.info("warm-up on %s:%d", warm.file, warm.line)
    bench.warm_up(bench.healed(warm))

    records: list[PromptRecord] = []
    skipped: dict[str, int] = {}
    skipped_prompts: list[dict[str, Any]] = []
    interrupted = False
    try:
        for slice_name in args.slices:
            skipped[slice_name] = 0
            done = 0
            for prompt in PromptSource(bench.engine, files, slice_name, args.prompt_tokens, args.seed):
                prompt = bench.healed(prompt)
                plain_timed = bench.run_plain(prompt.token_ids)
                plain = plain_timed[0]
                if len(plain.token_ids) < args.min_new_tokens:
                    skipped[slice_name] += 1
                    skipped_prompts.append(
                        {
                            "slice": slice_name,
                            "file": prompt.file,
                            "line": prompt.line,
                            "cursor": prompt.cursor,
                            "expected": prompt.expected,
                            "plain_text": plain.text,
                            "stop_reason": plain.stop_reason,
                        }
                    )
                    log.info(
                        "replacing %s:%d %s: plain greedy wrote %r",
                        prompt.file,
                        prompt.line,
                        prompt.cursor,
                        plain.text,
                    )
                    continue
                record = bench.run_prompt(prompt, len(records), plain_timed, args.repeats)
                records.append(record)
                done += 1
                log.info(
                    "%s %d/%d %s:%d %s plain %.0f ms/%d tok | %s",
                    slice_name,
                    done,
                    args.n,
                    prompt.file,
                    prompt.line,
                    prompt.cursor,
                    record.runs["plain"].decode_ms,
                    record.runs["plain"].produced_tokens,
                    " ".join(
                        f"{m}={r.decode_ms:.0f}{'' if r.matches_plain else '!MISMATCH'}"
                        for m, r in record.runs.items()
                        if m != "plain"
                    ),
                )
                if done >= args.n:
                    break
    except KeyboardInterrupt:  # a long run stopped by hand still reports what it measured
        interrupted = True
        log.warning("interrupted: summarizing the %d prompts done", len(records))

    summary = {
        s: summarize([r for r in records if r.slice == s], bench.methods)
        for s in args.slices
        if any(r.slice == s for r in records)
    }
    targets = check_targets(summary, records)
    exact = {
        s: sum(r.exact for r in records if r.slice == s) / max(1, sum(r.slice == s for r in records))
        for s in args.slices
    }
    print(format_tables(summary, targets, skipped, exact))

    env = environment(target, draft)
    env["loadavg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    payload = {
        "config": {
            "n": args.n,
            "slices": args.slices,
            "max_new_tokens": args.max_new_tokens,
            "prompt_tokens": args.prompt_tokens,
            "heal": args.heal,
            "seed": args.seed,
            "min_new_tokens": args.min_new_tokens,
            "repeats": args.repeats,
            "model": args.model,
            "quantization": target.quantization,
            "draft_model": None if draft is None else f"{args.model} ({draft.quantization})",
            "draft_head": args.draft_head,
            "methods": bench.methods,
            "stop_at_newline": True,
            "greedy": True,
            "prompt_lookup_num_tokens": PROMPT_LOOKUP_TOKENS,
            "min_rest_tokens": MIN_REST_TOKENS,
            "repeat_lines_after": REPEAT_LINES_AFTER,
        },
        "environment": env,
        "notes": [
            "ratios compare medians (or per-prompt geometric means) with plain greedy measured in this run",
            "every method's decode_ms = its total_ms - plain greedy's prefill_ms on the same prompt "
            "(the engine verifies its first draft in the prefill pass; its own split is engine_decode_ms)",
            "the engine prefills each prompt in one pass, as generate() does (the server chunks it)",
            f"per-prompt decode ratios floor decode_ms at {DECODE_FLOOR_MS} ms",
            "peers generate exactly plain greedy's produced_tokens tokens (the stopping token included)",
            "prompts where plain greedy wrote fewer than min_new_tokens tokens are replaced; see skipped",
            "with repeats > 1 every method runs that many rounds per prompt and its fastest run is kept",
            "the bf16 draft model affects speed only: greedy verification keeps the fp32 target's output",
        ],
        "interrupted": interrupted,
        "skipped": skipped,
        "skipped_prompts": skipped_prompts,
        "summary": summary,
        "targets": targets,
        "prompts": [asdict(r) for r in records],
        "elapsed_s": time.perf_counter() - started,
    }
    write_json(args.out, payload)
    log.info("wrote %s", args.out)
    try:
        png = plot(args.out, summary)
    except Exception as exc:  # a chart is a nicety; never lose a long run's exit status to it
        log.warning("no chart: %s", exc)
        png = None
    if png is not None:
        log.info("wrote %s", png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
