"""What a generation returns: its text, stop reason and statistics, as plain dataclasses.

Kept apart from the engine (torch) so that a runtime that decodes elsewhere (a remote engine,
``speculative_complete/lsp_server/remote``) can return the same result without importing torch, and below the
drafters, which count their drafts in ``DrafterStats``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

# Why a generation ended: an end-of-text token, the token limit, a stop (a stop string, the
# caller's own end, or healing that found no way on), a cancel, whole lines answered early
# (``GenerationConfig.answer_due``); a remote engine adds its own time budget and an error.
StopReason = Literal["eos", "max_tokens", "stop", "cancelled", "partial", "budget", "error"]


@dataclass
class DrafterStats:
    drafts: int = 0
    proposed: int = 0
    accepted: int = 0

    @property
    def acceptance(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    trimmed_tokens: int = 0  # dropped from the left because the prompt exceeded the context
    new_tokens: int = 0  # tokens returned
    produced_tokens: int = 0  # tokens the passes yielded up to the stop (returned + the stopping one)
    # produced_tokens + known_tokens: every token up to the stop
    target_passes: int = 0  # the prefill counts as one: it produces the first token
    prefill_tokens: int = 0  # tokens the prefill pass yielded: its first token + its draft's kept ones
    reused_tokens: int = 0  # prompt tokens whose keys and values came from a previous generation
    known_tokens: int = 0  # tokens taken from a previous generation's greedy continuation (no pass)
    prefill_ms: float = 0.0
    decode_ms: float = 0.0  # drafting + verifying + bookkeeping after the first token
    draft_ms: float = 0.0  # of decode_ms: time in the drafter
    verify_ms: float = 0.0  # of decode_ms: target passes over drafts
    drafters: dict[str, DrafterStats] = field(default_factory=dict)

    @property
    def tokens_per_pass(self) -> float:
        return self.produced_tokens / self.target_passes if self.target_passes else 0.0

    @property
    def after_prefill(self) -> tuple[int, int]:
        """(tokens, passes) after the prefill: what the drafts bought where the prompt's pass,
        which any decode pays, is left out. A short decode's tokens per pass is dominated by its
        prefill; this pair is the drafters' own figure."""
        if not self.target_passes:
            return 0, 0
        return max(0, self.produced_tokens - self.prefill_tokens), self.step_passes

    @property
    def step_passes(self) -> int:
        """The decode steps' passes (``verify_ms`` is their time): every target pass but the
        prefill's, which a decode going on from a known greedy chain never made."""
        return self.target_passes - (1 if self.prefill_tokens else 0)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["tokens_per_pass"] = round(self.tokens_per_pass, 4)
        for name in ("prefill_ms", "decode_ms", "draft_ms", "verify_ms"):
            out[name] = round(out[name], 2)
        for name, stats in self.drafters.items():
            out["drafters"][name]["acceptance"] = round(stats.acceptance, 4)
        return out


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]  # tokens whose text lies entirely before any stop; no EOS
    stop_reason: StopReason
    stats: GenerationStats


__all__ = ["DrafterStats", "GenerationResult", "GenerationStats", "StopReason"]
