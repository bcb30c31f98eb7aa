#!/usr/bin/env bash
# On a bare torch GPU machine, from the repository root: install what prepare.sh put in
# .gpu-upstream/ into /tmp/site, then run the given command with sglang 0.5.23 importable:
#   bash tools/gpu-upstream/device.sh python3 -m pytest test/gpu_upstream -q
# The import shim (sitecustomize.py + stubs.py beside this file) starts in every Python
# process. With OUT set, SGLang's kernel cache directory ($SGLANG_CACHE_DIR, ~/.cache/sglang:
# SGLang points Triton, inductor and the CUDA cache there as well as its own JIT kernels) is
# saved as $OUT/jit_cache.txz (SGLang's JIT kernels) and $OUT/triton_cache.txz (the rest: Triton,
# inductor, CUDA); put either in .gpu-upstream/ to skip those builds next time. xz, not gzip: the
# kernels share most of their bytes and xz's window finds that (the slice's JIT cache: 3.7 MB
# against 14.6 MB), which keeps the kit under the carry limit.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
U="$ROOT/.gpu-upstream"
SITE=/tmp/site
T0=$(date +%s)
# Wheels are installed once per machine, each when it first travels: a call that leaves one out
# (to stay under the carry limit) and a later call on the same machine that brings it both work.
# A GPU machine's carry holds 64 MiB with the tracked tree (about 14 MB): the kit without chat/
# (about 47 MB: name its other entries in carry) travels first, then TileLang (.gpu-tilelang,
# about 37 MB) with chat/ where an HTTP server needs it (13 MB: the DeepSeek-V4 chat encoder;
# both with the tree about 62 MiB) on the next call to the same warm machine, whose ignored
# folders stay between calls.
mkdir -p "$SITE"
shopt -s nullglob
NEW=()
for w in "$U"/wheels/*.whl "$U"/chat/*.whl; do
  grep -qxF "${w##*/}" "$SITE/.installed" 2>/dev/null || NEW+=("$w")
done
if [[ ${#NEW[@]} -gt 0 ]]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "${NEW[@]}" \
    || { echo "gpu-upstream: pip install of the carried wheels failed (run tools/gpu-upstream/prepare.sh, carry .gpu-upstream)" >&2; exit 1; }
  printf '%s\n' "${NEW[@]##*/}" >> "$SITE/.installed"
fi
if [[ ! -f "$SITE/.pruned" ]]; then
  [[ -f "$U/sglang_pruned.txz" ]] || { echo "gpu-upstream: the kit is not on this machine: carry .gpu-upstream (run tools/gpu-upstream/prepare.sh)" >&2; exit 1; }
  tar xJf "$U/sglang_pruned.txz" -C "$SITE" && touch "$SITE/.pruned"
fi
TL="$ROOT/.gpu-tilelang"
if [[ -f "$TL/tilelang_site.txz" && ! -f "$SITE/.tilelang" ]]; then
  tar xJf "$TL/tilelang_site.txz" -C "$SITE" && touch "$SITE/.tilelang"
fi
# TileLang compiles each kernel on first use (about 5 s each); its cache travels like the JIT's.
export TILELANG_CACHE_DIR="${TILELANG_CACHE_DIR:-$HOME/.tilelang/cache}"
mkdir -p "$TILELANG_CACHE_DIR"
[[ -f "$TL/tilelang_cache.txz" ]] && tar xJf "$TL/tilelang_cache.txz" -C "$TILELANG_CACHE_DIR"
CACHE="${SGLANG_CACHE_DIR:-$HOME/.cache/sglang}"
mkdir -p "$CACHE"
for a in jit_cache triton_cache; do
  [[ -f "$U/$a.txz" ]] && tar xJf "$U/$a.txz" -C "$CACHE"
done
if ls "$U"/hdr/sgl_deep_gemm-*.whl >/dev/null 2>&1 && [[ ! -d /tmp/cutlass_hdr ]]; then
  python3 - "$U"/hdr/sgl_deep_gemm-*.whl <<'PY'
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
z.extractall("/tmp/cutlass_hdr", [n for n in z.namelist() if n.startswith(("deep_gemm/include/cutlass/", "deep_gemm/include/cute/"))])
PY
fi
[[ -d /tmp/cutlass_hdr ]] && export CUTLASS_INCLUDE=/tmp/cutlass_hdr/deep_gemm/include
# shim/ holds sitecustomize.py and stubs.py; engine/ (put first by kit_server.sh and the Engine drivers) the
# Engine stand-ins and a metadata-only sglang_kernel dist-info.
export PYTHONPATH="$SITE:$HERE/shim:$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 MAX_JOBS="${MAX_JOBS:-16}" MIXGRAPH_GPU_UPSTREAM_KIT=1
# The lent machines' rule, for every process started from here (servers, Engine ranks): NVLink
# multicast off. The same three as sglang_mixgraph.kits.gpu_machine.NO_MULTICAST_ENV.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
echo "gpu-upstream: install $(( $(date +%s) - T0 ))s; $(python3 -c 'import torch,triton;print("torch",torch.__version__,"triton",triton.__version__,torch.cuda.get_device_name())')"
"$@"
rc=$?
if [[ -n "${OUT:-}" ]]; then
  [[ -d "$CACHE/jit" ]] && XZ_OPT=-T0 tar cJf "$OUT/jit_cache.txz" -C "$CACHE" jit
  REST=$(cd "$CACHE" && ls -A | grep -vx jit)
  [[ -n "$REST" ]] && XZ_OPT=-T0 tar cJf "$OUT/triton_cache.txz" -C "$CACHE" $REST
  [[ -n "$(ls -A "$TILELANG_CACHE_DIR")" ]] && XZ_OPT=-T0 tar cJf "$OUT/tilelang_cache.txz" -C "$TILELANG_CACHE_DIR" .
fi
exit $rc
