#!/usr/bin/env bash
# Fill .gpu-upstream/ (git-ignored) in the repository root with what a bare torch GPU machine
# (torch, Triton, nvcc; no sglang, no package index) needs to run SGLang 0.5.23's own Python
# code: small wheels, sglang's wheel without multimodal_gen and the Rust extensions, and the
# CUTLASS/CuTe headers of the SM90 Q8KV8 JIT kernel. About 57 MB. Needs pip and an index.
#
#   bash tools/gpu-upstream/prepare.sh
#   (GPU machine, carry .gpu-upstream)  bash tools/gpu-upstream/device.sh python3 -m pytest test/gpu_upstream -q
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
U="$ROOT/.gpu-upstream"
mkdir -p "$U/wheels" "$U/hdr"
PLAT=(--platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_34_x86_64
      --platform manylinux1_x86_64)
dl() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
         "${PLAT[@]}" -d "$1" "$2" 2>&1 | grep -v '^WARNING' || true; }
# The versions a full `pip install sglang==0.5.23` resolves to. sgl-flash-mla uses torch's
# stable ABI, so it loads on the GPU machine's older torch. cuda-bindings (cuda-python, an sglang
# dependency): upstream's breakable graph and its dedup registry, and drop_empty_segments' node count.
# For `python -m sglang.launch_server` (tokenizer on), sglang.benchmark.serving and sglang.test.run_eval:
SERVE=(uvicorn==0.54.0)           # http_server's HTTP server (imported at module level; click, h11 are there)
SERVE+=(python-multipart==0.0.34) # FastAPI refuses to build http_server's Form(...) routes without it
SERVE+=(xgrammar==0.2.7)          # the scheduler builds the default grammar backend when the tokenizer is on (binds via tvm-ffi)
SERVE+=(jsonschema==4.26.0)       # /v1/chat/completions checks each request tool's parameters schema with it
SERVE+=(referencing==0.37.0)      # jsonschema's dependency
SERVE+=(jsonschema-specifications==2025.9.1) # jsonschema's dependency
SERVE+=(rpds-py==2026.9.1)        # referencing's dependency (attrs is there)
for w in msgspec==0.23.0 orjson==3.13.0 pybase64==1.5.1 pydantic==2.14.4 pydantic-core==2.50.5 \
         annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0 pyzmq==27.3.0 \
         partial-json-parser==0.2.1.1.post7 dill==0.4.1 setproctitle==1.3.8 apache-tvm-ffi==0.1.11 \
         starlette==1.10.0 fastapi==0.165.0 opentelemetry-api==1.45.2 openai==2.8.0 jiter==0.19.0 \
         distro==1.9.0 sniffio==1.3.1 sgl-flash-mla==1.0.0 cuda-bindings==13.4.4 cuda-pathfinder==1.9.1 \
         "${SERVE[@]}"; do
  ls "$U/wheels" | grep -qi "^$(echo "${w%%==*}" | tr '-' '_')-${w##*==}-" || dl "$U/wheels" "$w"
done
# A DeepSeek-V4 checkpoint's chat encoder (12.8 MB; Rust, no torch), built at HTTP server start:
# apart in chat/, so Engine runs (token ids in) can leave it out of the carry.
mkdir -p "$U/chat"
ls "$U/chat" | grep -q '^deepseek_recipe-0.2.0-' || dl "$U/chat" deepseek-recipe==0.2.0
rm -f "$U"/wheels/deepseek_recipe-*.whl  # an older kit kept it in wheels/
# Only the CUTLASS/CuTe headers of this wheel are used (device.sh extracts them).
ls "$U/hdr" | grep -q '^sgl_deep_gemm-0.2.3.post2-' || dl "$U/hdr" sgl-deep-gemm==0.2.3.post2
if [[ ! -f "$U/sglang_pruned.txz" ]]; then
  tmp=$(mktemp -d)
  dl "$tmp/dl" sglang==0.5.23
  mkdir -p "$tmp/sgl" && (cd "$tmp/sgl" && python3 -m zipfile -e "$tmp"/dl/sglang-0.5.23-*.whl .)
  rm -rf "$tmp/sgl/sglang/multimodal_gen" "$tmp"/sgl/sglang/srt/rust_extensions/_*.so
  tar cJf "$U/sglang_pruned.txz" -C "$tmp/sgl" sglang sglang-0.5.23.dist-info
  rm -rf "$tmp"
fi
# SGLang's TileLang kernels (mHC pre/post, the fused post+pre, the sinkhorn, the paged MQA
# logits): tilelang links tvm-ffi and z3, not torch, so it runs on the GPU machine's torch. Its
# wheel and z3's (80 MB) are unpacked, pruned of what the runtime never reads (the
# composable_kernel and TVM sources, CUTLASS's tools, the z3 binary, the second copy of libz3)
# and packed with xz into .gpu-tilelang/, carried on a call of its own (device.sh says why).
TL="$ROOT/.gpu-tilelang"
if [[ ! -f "$TL/tilelang_site.txz" ]]; then
  mkdir -p "$TL"
  tmp=$(mktemp -d)
  dl "$tmp/dl" tilelang==0.1.12
  dl "$tmp/dl" z3-solver==4.15.4.0
  mkdir -p "$tmp/site"
  for w in "$tmp"/dl/*.whl; do (cd "$tmp/site" && python3 -m zipfile -e "$w" .); done
  rm -rf "$tmp/site/tilelang/3rdparty/composable_kernel" "$tmp/site/tilelang/3rdparty/tvm/src" \
         "$tmp/site/tilelang/3rdparty/cutlass/tools" "$tmp/site/bin"
  ln -sf libz3.so "$tmp/site/z3/lib/libz3.so.4.15"
  XZ_OPT="-9 -T0" tar cJf "$TL/tilelang_site.txz" -C "$tmp/site" .
  rm -rf "$tmp"
fi
du -sh "$U" "$TL"
