"""Test-suite setup shared by every CPU test.

SGLang resolves its platform once per process, when `sglang.srt.utils` is first
imported; select the described-GPU platform before any test imports sglang so
that server-argument resolution can be run for a target GPU (see
sglang_mixgraph.target_gpu). Outside `described_gpu(...)` blocks the platform
object answers for the default target, and the device probes tell the truth.
"""

from sglang_mixgraph.resolve import select_described_platform

select_described_platform()
