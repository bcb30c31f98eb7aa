"""What only the tests and the benchmarks run: references of GPU kernels and the V4 cache codec.

The server never imports this package. `v4_kv_layout` encodes and decodes DeepSeek-V4's
584-byte paged fp8 KV cache; `sparse_mla` is a torch reference of FlashMLA's sparse MLA
(decode and prefill, with attention sink); `sparse_prefill_kernels` are torch references of
the DeepSeek-V4 sparse-prefill leaf kernels that let the CPU tests run upstream's backend;
`v4_dequant` is our Triton dequantizer of the V4 cache into a bf16 workspace, which the kernel
benchmark times against the split. All of it imports without a GPU (Triton lazily).
See docs/mixed-split-kernels.md.
"""
