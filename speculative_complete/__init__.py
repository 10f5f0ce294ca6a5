"""lsp-speculative-complete: a code-completion LSP server with lossless speculative decoding.

One top-level package, so that installing the project puts one name of its own into
site-packages: the two packages it was, ``decoding`` and ``lsp_server``, had generic names, and
PyPI's unrelated ``decoding`` package (0.1.4, "Composable inference algorithms with LLMs")
installs under the same one. They are its two subpackages now:

- ``speculative_complete.decoding``: the model side (torch, no LSP); it never imports
  ``lsp_server`` (``tests/project/test_layout.py``).
- ``speculative_complete.lsp_server``: the protocol edge (pygls, asyncio), run as the
  ``lsp_server`` program or ``python -m speculative_complete.lsp_server``.

Nothing is imported here: importing a subpackage costs only what that subpackage imports.
"""
