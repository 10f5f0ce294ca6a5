"""Draft sources behind one interface; ``make_drafter`` builds one by name."""

from __future__ import annotations

from speculative_complete.decoding.choices import DRAFTER_NAMES, DrafterName
from speculative_complete.decoding.cost_model import CostModel
from speculative_complete.decoding.drafter_interface import Draft, Drafter
from speculative_complete.decoding.drafters.auto import AutoDrafter
from speculative_complete.decoding.drafters.head import HeadDrafter, load_head_drafter
from speculative_complete.decoding.drafters.model import ModelDrafter
from speculative_complete.decoding.drafters.ngram import NgramDrafter
from speculative_complete.decoding.models.loading import LoadedModel


def make_drafter(
    name: DrafterName,
    *,
    draft_model: LoadedModel | None = None,
    draft_head: HeadDrafter | None = None,
    cost: CostModel | None = None,
    max_draft: int = 16,
    session_cache_bytes: int = 0,
    target_vocab: int | None = None,
) -> Drafter | None:
    """``none`` gives None (plain decoding); ``model`` needs ``draft_model``, ``head`` a
    ``draft_head``; ``auto`` chooses among whichever of them it is given and the n-gram source.

    ``session_cache_bytes`` bounds the draft model's per-document KV caches (0: one cache only).
    ``target_vocab`` is the target's output size, which a draft model's proposals and q rows are
    fitted to (None: the draft's own; pass it whenever the two may differ)."""
    if name == "none":
        return None
    if name == "ngram":
        return NgramDrafter(max_draft=max_draft, cost=cost)
    if name == "head":
        if draft_head is None:
            raise ValueError("the 'head' drafter needs a draft head for this model (draftHead)")
        draft_head.cost = cost or draft_head.cost
        return draft_head
    if name == "model":
        if draft_model is None:
            raise ValueError("the 'model' drafter needs a draft model (--draft-model)")
        return ModelDrafter(
            draft_model,
            max_draft=max_draft,
            cost=cost,
            session_cache_bytes=session_cache_bytes,
            target_vocab=target_vocab,
        )
    if name == "auto":
        model = None
        if draft_model is not None:
            model = ModelDrafter(
                draft_model,
                max_draft=max_draft,
                cost=cost,
                session_cache_bytes=session_cache_bytes,
                target_vocab=target_vocab,
            )
        return AutoDrafter(NgramDrafter(max_draft=max_draft, cost=cost), model, cost=cost, head=draft_head)
    raise ValueError(f"unknown drafter {name!r}; choose one of {', '.join(DRAFTER_NAMES)}")


__all__ = [
    "DRAFTER_NAMES",
    "AutoDrafter",
    "CostModel",
    "Draft",
    "Drafter",
    "DrafterName",
    "HeadDrafter",
    "ModelDrafter",
    "NgramDrafter",
    "load_head_drafter",
    "make_drafter",
]
