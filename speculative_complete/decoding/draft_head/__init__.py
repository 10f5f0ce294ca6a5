"""The EAGLE-style draft head: a one-layer network that drafts from the target's hidden states.

``network`` is the head itself (``DraftHead``) and where shipped heads are found (``weights``,
one folder per target); ``features`` streams the target's hidden states for training and
``training`` trains a head on them (``python -m
speculative_complete.decoding.draft_head.training``). The drafter that runs a head inside the engine
is ``speculative_complete.decoding.drafters.head``. Not to be confused with a model's output layer
(``speculative_complete.decoding.forward.quant.layers``), which some code calls ``lm_head``.
"""
