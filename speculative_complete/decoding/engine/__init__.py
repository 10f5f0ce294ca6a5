"""The speculative decoding loop and what it decides with.

``loop`` drafts, verifies in one target pass, accepts and rolls back (``SpeculativeEngine``);
``healing`` constrains a healed prompt's first tokens; ``stops`` cuts the text; ``pacing`` sizes
prefill passes by measured time. ``healing`` imports no torch, so a server on a remote engine
uses it without it.

What the engine shares with the drafters sits below both, in leaf modules of ``decoding``: the
drafter interface (``speculative_complete.decoding.drafter_interface``), the acceptance rules that
keep greedy output the target's own and sampled output the target's distribution
(``speculative_complete.decoding.verify``), the ``CostModel``
(``speculative_complete.decoding.cost_model``), each document's cache and greedy chain between
requests (``speculative_complete.decoding.kv_cache``) and what a generation returns
(``speculative_complete.decoding.results``). The engine calls drafters only through the interface
and never imports ``speculative_complete.decoding.drafters`` (``tests/test_layout.py``).
"""
