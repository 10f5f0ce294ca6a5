"""The tree-or-chain measurement of the draft head (``benchmarks/head_tree.py``): its arithmetic,
and a brief run on the default model's shipped head over held-out code."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmarks.head_tree import chain_kept, tree_kept


def test_a_chain_keeps_the_running_products_of_its_rates():
    assert chain_kept([0.5, 0.5, 0.5], 1) == pytest.approx(0.5)
    assert chain_kept([0.5, 0.5, 0.5], 3) == pytest.approx(0.5 + 0.25 + 0.125)
    assert chain_kept([0.5], 3) == pytest.approx(0.5)  # no rates past the measured depth


def test_the_best_tree_takes_the_likeliest_nodes_whose_parents_it_has():
    firsts, rates = [0.5, 0.3, 0.1], [0.5, 0.5, 0.5]
    assert tree_kept(firsts, rates, 1) == pytest.approx(0.5)
    assert tree_kept(firsts, rates, 2) == pytest.approx(0.5 + 0.3)  # the sibling beats 0.25
    assert tree_kept(firsts, rates, 3) == pytest.approx(0.5 + 0.3 + 0.25)
    assert tree_kept(firsts, rates, 4) == pytest.approx(0.5 + 0.3 + 0.25 + 0.15)
    # with no second choice worth anything, the best tree is the chain
    assert tree_kept([0.5, 0.0, 0.0], rates, 3) == pytest.approx(chain_kept(rates, 3))


@pytest.mark.real_model
def test_the_shipped_heads_chain_and_tree_on_held_out_code(tmp_path):
    out = tmp_path / "tree.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.head_tree", "--tokens", "512", "--depth", "3", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["head"].endswith("smollm2-135m-instruct")
    firsts, rates = result["first_position_choices"], result["chain_agreement"]
    # both count the head's first choice at every first position: the same share
    assert firsts[0] == pytest.approx(rates[0], abs=1e-4)
    assert firsts[0] > firsts[1] > firsts[2] and 0.2 < firsts[0] < 0.9
    rows = result["expected_kept"]
    assert [row["draft_rows"] for row in rows] == [1, 2, 3]
    assert rows[0]["tree"] == rows[0]["chain"]
    assert all(row["tree"] >= row["chain"] - 1e-4 for row in rows)
    calibration = result["first_choice_calibration"]
    assert sum(b["share"] for b in calibration) == pytest.approx(1.0, abs=1e-3)
    seen = [b["agreement"] for b in calibration if b["agreement"] is not None]
    assert seen[-1] > seen[0]  # a surer head is right more often
