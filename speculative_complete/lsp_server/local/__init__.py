"""The local engine: completions decoded in this process by ``decoding``'s speculative engine on
the machine's own CPU or GPU, against ``speculative_complete/lsp_server/remote`` (an inference server).
``local_runtime.py`` holds what one load produced (``LocalRuntime``: the engine, its drafter, the
tokenizer), ``generation.py`` what it asks the engine to decode, and ``loading.py`` how it is
loaded; ``decoding`` (and so torch) is imported only inside their functions, on the loader and
worker threads, so importing this package stays light.
"""
