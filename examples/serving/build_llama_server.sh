#!/usr/bin/env bash
# Build llama.cpp's own llama-server from the llama.cpp source vendored in the llama-cpp-python sdist that
# the Makefile builds, with the Makefile's CPU flags; the anchor of docs/batched-serving.md.
#   examples/serving/build_llama_server.sh [OUT_DIR]   (default: ~/.cache/kvgraft/llama-server)
set -euo pipefail
VERSION=0.3.36
OUT=${1:-$HOME/.cache/kvgraft/llama-server}
mkdir -p "$OUT"
cd "$OUT"
if [ ! -d "llama_cpp_python-$VERSION" ]; then
  pip download --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d . -q
  tar xzf "llama_cpp_python-$VERSION.tar.gz"
fi
SRC="llama_cpp_python-$VERSION/vendor/llama.cpp"
cmake -S "$SRC" -B build -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_LLAMAFILE=OFF \
  -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON >/dev/null
cmake --build build --target llama-server -j "$(nproc)"
echo "$OUT/build/bin/llama-server"
