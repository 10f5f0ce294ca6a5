"""The small-batch linear layers compute what ``nn.Linear`` computes, for any number of rows."""

from __future__ import annotations

import pytest
import torch

from speculative_complete.decoding.forward.cpu_matmul import SmallBatchLinear, use_small_batch_linear
from tests.support.tiny_models import TINY_VOCAB, tiny_model


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(576, 1536), (1536, 576), (64, 64)])
def test_small_batch_linear_equals_linear_for_every_row_count(shape, bias):
    torch.manual_seed(0)
    reference = torch.nn.Linear(*shape, bias=bias)
    fast = torch.nn.Linear(*shape, bias=bias)
    fast.load_state_dict(reference.state_dict())
    assert use_small_batch_linear(fast) == 1 and isinstance(fast, SmallBatchLinear)
    with torch.inference_mode():
        for rows in (0, 1, 2, 3, 5, 9, 10, 33):
            for x in (torch.randn(rows, shape[0]), torch.randn(1, rows, shape[0])):
                mine, theirs = fast(x), reference(x)
                assert mine.shape == theirs.shape and mine.is_contiguous()
                torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)


def test_switching_a_model_keeps_its_weights_ties_and_logits():
    model = tiny_model(31, layers=2)
    ids = torch.randint(0, TINY_VOCAB, (1, 7))
    with torch.inference_mode():
        before = [model(input_ids=ids[:, :n]).logits for n in (1, 2, 7)]
        switched = use_small_batch_linear(model)
        after = [model(input_ids=ids[:, :n]).logits for n in (1, 2, 7)]
    assert switched == sum(1 for m in model.modules() if isinstance(m, SmallBatchLinear)) > 2 * 7
    assert use_small_batch_linear(model) == 0  # already switched
    for b, a in zip(before, after, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    out = model.get_output_embeddings()
    if model.config.tie_word_embeddings:
        assert out.weight is model.get_input_embeddings().weight
