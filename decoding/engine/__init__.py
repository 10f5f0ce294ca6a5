"""The speculative decoding loop and what it decides with.

``loop`` drafts, verifies in one target pass, accepts and rolls back (``SpeculativeEngine``);
``verify`` holds the acceptance rules that keep greedy output the target's own and sampled
output the target's distribution; ``healing`` constrains a healed prompt's first tokens;
``stops`` cuts the text; ``kv_cache`` keeps each document's cache and greedy chain between
requests; ``pacing`` sizes prefill passes by measured time. ``results`` and ``healing`` import
no torch, so a server on a remote engine uses them without it.
"""
