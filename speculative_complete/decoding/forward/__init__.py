"""The target's forward pass behind ``ModelPass`` (``model_pass``), in three implementations.

``TransformersPass`` runs any causal LM transformers loads; ``llama`` is the lean CPU forward on a
GGUF's own quantized blocks (``quant``; llama.cpp's kernels in ``native`` where built), with an
output layer that certifies its greedy choices exact; ``graphed`` is its fixed-width variant
captured in CUDA graphs. Which model families the lean forward runs is one table
(``architectures``), read by its shape checks (``shapes``), its loaders (``gguf_loader``,
``transformers_loader``, both built on ``assembly``) and the model listing. The caches they hand
out are what the engine crops and the prefix store keeps; nothing here knows about drafting.
"""
