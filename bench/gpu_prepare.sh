#!/bin/bash
# Prepares, on the developer's machine, what bench/gpu_session.sh carries to a lent GPU machine
# (which reaches no package registry), in the repository's root:
#   .gpu/src.tar.xz    llama.cpp from the pinned llama-cpp-python source package's vendor/, without
#                      its test models, docs, web UI and the GPU backends other than CUDA (the
#                      whole package is over the 64 MiB a call carries)
#   .gpu/py/llama_cpp  llama-cpp-python's Python files (the libraries come from the CUDA build)
#   .gpu/shared/       the ../shared files the benchmarks read
#   .whl/              the wheels the machine's Python 3.12 lacks: ggbatch's own, lm-eval's and
#                      those of llama-cpp-python's server (bench/lmeval_compare.py's peer)
# All three are ignored by git (.git/info/exclude). Then, on the machine:
#   bash bench/gpu_session.sh        (carry .gpu and .whl)
#
# Usage: bash bench/gpu_prepare.sh [llama_cpp_python-0.3.36.tar.gz]
#   (default: downloaded with pip download --no-binary :all: --no-deps llama-cpp-python==0.3.36)
set -euo pipefail
VERSION=0.3.36
[ -f pyproject.toml ] && [ -d ../shared ] || { echo "run from the repository root, with ../shared beside it" >&2; exit 2; }
for path in /.gpu/ /.gpubuild/ /.whl/; do
  grep -qxF "$path" .git/info/exclude 2>/dev/null || echo "$path" >> .git/info/exclude
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sdist=${1:-}
if [ -z "$sdist" ]; then
  python3 -m pip download -q --no-binary :all: --no-deps "llama-cpp-python==$VERSION" -d "$tmp"
  sdist=$tmp/llama_cpp_python-$VERSION.tar.gz
fi
tar xzf "$sdist" -C "$tmp"
pkg=$tmp/llama_cpp_python-$VERSION
src=$pkg/vendor/llama.cpp
rm -rf "$src"/{models,docs,benches,media,.github} "$src"/tools/server/public*
# llama-server links the web UI's library: its CMake files stay, its sources (built with npm) go
find "$src/tools/ui" -mindepth 1 -maxdepth 1 ! -name CMakeLists.txt ! -name sources.cmake ! -name 'ui.*.in' \
  -exec rm -rf {} +
for backend in blas cann et hexagon hip metal musa opencl openvino rpc sycl virtgpu vulkan webgpu zdnn zendnn; do
  rm -rf "$src/ggml/src/ggml-$backend"
done
rm -rf .gpu && mkdir -p .gpu/py .gpu/shared/models .gpu/shared/data/gsm8k .gpu/shared/data/lsat-rc .gpu/shared/data/mmlu .whl
tar cJf .gpu/src.tar.xz -C "$src" .
cp -r "$pkg/llama_cpp" .gpu/py/
rm -rf .gpu/py/llama_cpp/lib .gpu/py/llama_cpp/__pycache__
cp ../shared/models/ggml-vocab-qwen2.gguf .gpu/shared/models/
cp ../shared/data/gsm8k/questions.jsonl .gpu/shared/data/gsm8k/
cp ../shared/data/lsat-rc/questions.jsonl .gpu/shared/data/lsat-rc/
cp ../shared/data/mmlu/questions.jsonl .gpu/shared/data/mmlu/
rm -f .whl/*.whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl multiprocess==0.70.19 dill==0.4.1 gguf==0.19.0 diskcache==5.6.3 \
  lm_eval==0.4.13 datasets==5.2.0 fsspec==2026.9.0 tenacity==9.2.1 pytz==2026.6 chardet==6.0.0.post1 \
  fastapi==0.165.0 starlette==1.10.0 pydantic==2.14.4 pydantic_core==2.50.5 pydantic-settings==2.16.3 \
  python-dotenv==1.2.4 typing-inspection==0.4.5 annotated-types==0.8.0 typing_extensions==4.16.0 \
  uvicorn==0.54.0 sse-starlette==3.7.0 starlette-context==0.3.6 opentelemetry-api==1.45.2 sniffio==1.3.1 \
  truststore==0.10.5
du -sh .gpu .whl
echo "ready: carry .gpu and .whl to bash bench/gpu_session.sh (under 64 MiB together with the tree)"
