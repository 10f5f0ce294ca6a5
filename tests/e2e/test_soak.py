"""The soak (``benchmarks/soak.py``), bounded, on the tiny random-weight model: the real server
process under a seeded mix of real files, typing, cancels, close/reopen, a 6 MB document and bad
traffic, with a model reload to a bad path and back, an exception inside one decode, stdin closed
mid-decode and a TCP client dropping mid-request. Takes one to two minutes on 2 cores.

The soak's own checks are the assertions (``problems``): every parseable request answered exactly
once with the right kind of answer, the counters of ``lsp_server/stats`` equal to what was sent,
RSS after warm-up under a fixed bound, ``shutdown``/``exit`` ending with 0, and each faulted
process ending within 2 s with nothing left behind. Before the protocol fix for a too-short
Content-Length, this test failed: the server stopped reading frames and the soak timed out.
"""

from __future__ import annotations

from benchmarks.soak import SoakConfig, soak
from tests.support.lsp import tiny_model_dir

STEPS = 1000
FRAME_KINDS = {
    "truncated body",
    "not JSON",
    "not UTF-8, not JSON",
    "not UTF-8 inside a string",
    "Content-Length too long",
    "Content-Length too short",
    "JSON that is not a message",
}


async def test_the_server_holds_its_promises_under_a_hostile_mix_and_faults(tmp_path):
    result = await soak(
        SoakConfig(model=str(tiny_model_dir()), steps=STEPS, seed=0, files=64, big_mb=6.0, log_dir=tmp_path)
    )
    assert result["problems"] == [], (result["problems"], tmp_path)
    figures = result["figures"]
    # The premises: the mix really had each kind of traffic, and the faults really happened.
    assert figures["steps"] == STEPS and figures["answered"] == figures["requests"] > STEPS // 2
    assert figures["cancels"] > 20 and figures["bad_requests"] > 20 and figures["fallback_requests"] > 20
    assert figures["closes"] > 3 and figures["opens"] > figures["closes"]
    assert set(result["bad_frames"]) == FRAME_KINDS
    assert figures["files"] >= 60
    stats = result["server_stats"]
    # The injected decode fault is checked by the soak itself (a failed request, or, when a newer
    # request had superseded that one before its decode raised, the server's log): see problems.
    assert stats["cancelled"] > 0 and stats["errors"] > 0 and stats["decodes"] > 50
    assert result["faults"]["stdin_closed"]["decoding_when_closed"]
    assert result["faults"]["tcp_dropped"]["decoding_when_dropped"]
    assert result["rss"]["samples"] >= 40
