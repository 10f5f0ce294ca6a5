"""llama.cpp's CPU kernels for the lean forward's products, where they are built (``build.py``).

Why: torch's 4-bit kernel is the only quantized product torch has on the CPU. On AVX2 it is no
faster than fp32, it takes no 16-value sub-blocks (Q6_K, Q3_K, Q2_K: padded terms, at 2.5 bytes a
weight), and its packed copy doubles the weights' memory. llama.cpp's kernels multiply a GGUF's
own blocks where they lie in the memory-mapped file, with activations quantized per block as
llama.cpp quantizes them, tuned for each ISA. ``lsqmm.c`` calls them one output at a time where
a type has nothing faster; ``krows.c`` (a weight block unpacked once for four rows) and, on
AVX-512, ``kpairs.c`` (Q4_K and Q6_K, two weight rows to a register) sum each output exactly as
they sum it alone, asking for the weights ahead of their use, so each output is computed the
same whatever the rows of a pass:
batch-invariant by construction, as the lean forward needs. Where rounding enters: the
activations, quantized to the weight type's activation type (Q8_0, Q8_1 or Q8_K blocks) per row.

The modules: ``build.py`` builds the library once per machine (``python -m
speculative_complete.decoding.forward.native --build``); ``library.py`` binds it (``Kernels``);
``serving.py`` decides whether a process multiplies on it; ``weights.py`` holds a weight in a GGUF's
own blocks; ``linear.py`` and ``output_layer.py`` are the lean forward's layers on it, ``layers.py``
all its layers in one call.
"""
