"""Loading a model: from a path, a hub id in the local cache or a GGUF to a ``LoadedModel``.

``discovery`` finds model files and names what is missing in its errors, ``loading`` picks the
forward a file runs on (the lean quantized one where it covers the architecture, transformers'
otherwise) and caches converted copies, and ``tokenizer`` reads a GGUF's tokenizer without
transformers' slow conversion. Nothing here decodes.
"""
