"""The names a user chooses among (drafters, load-time quantizations), declared once.

Pure Python, without torch: the server's settings (``speculative_complete/lsp_server/config.py``)
validate against these on the event loop, and the CLIs offer them as choices.
"""

from __future__ import annotations

from typing import Literal, get_args

DrafterName = Literal["none", "ngram", "head", "model", "auto"]
DRAFTER_NAMES: tuple[DrafterName, ...] = get_args(DrafterName)

Quantization = Literal["auto", "none", "int8", "int4"]
QUANTIZATIONS: tuple[Quantization, ...] = get_args(Quantization)
