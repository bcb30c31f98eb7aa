"""Test and benchmark kits: what tests and benchmarks share, as upstream's `sglang.test.kits`.

The server never imports this package (test/test_package_layout.py keeps it so); it may import
torch at the top and sglang inside functions. One module per kit:
`dsv4_cpu` upstream's DeepSeek-V4 backend and pool on CPU with torch leaf kernels (World, Step);
`dsv4_gpu` the same world on CUDA with upstream's real backend, metadata and breakable graphs;
`synthetic_step` kernel-level mixed steps (caches, indices, workspaces, split/unsplit attention);
`install` patches installed as the plugin installs them, and taken out again;
`bcg_capture` a breakable CUDA graph captured as upstream's runner captures it;
`model_configs` config.json files of small models for server-argument resolution;
`cost_fit` fitting the adaptive policy's cost model to measured timings;
`host_timers` host time of named functions of the server's code inside a benchmark's phase;
`profiler_trace` chrome traces in torch.profiler's format, built event by event;
`gpu_machine` what the drivers read of the bare-torch GPU machine's set-up (tools/gpu-upstream);
`broken_import` a module whose import raises in a fresh process (a kernel library that will not
load).
"""
