#!/usr/bin/env bash
# Builds the seed corpora (fuzz/corpus/{descriptor,yaml}) from the kit examples.
# The corpus is not committed (/fuzz/corpus is gitignored); run this before fuzzing.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(dirname "$here")"
shared="${SHARED_DIR:-$(dirname "$repo")/shared}"
out="$here/corpus/descriptor"
mkdir -p "$out" "$here/corpus/yaml"
n=0
shopt -s nullglob
for f in "$shared"/corpus/sandbox-kit-spec/examples/*/*.yaml "$shared"/corpus/sandbox-kit-spec/examples/*/*.yml; do
  cp "$f" "$out/spec-$(basename "$(dirname "$f")")-$(basename "$f")"; n=$((n+1))
done
for f in "$repo"/examples/kits/*/kit.yaml; do
  cp "$f" "$out/kit-$(basename "$(dirname "$f")").yaml"; n=$((n+1))
done
# The raw reader starts from the same texts.
cp "$out"/* "$here/corpus/yaml/" 2>/dev/null || true
echo "seeded $n files into $out (and corpus/yaml)"
