"""The project's own GPU kernels (Triton). Imported lazily: importing this package needs no GPU.

Our own kernels live here, as a subpackage of the
plugin, so that the installed plugin (and the GPU machine, which has no sglang) imports them
without any sys.path changes. See docs/mixed-split-kernels.md.
"""
