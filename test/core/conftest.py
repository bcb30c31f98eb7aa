"""CPU tests of sglang_mixgraph.core and sglang_mixgraph.reference. benchmark/ holds the synthetic mixed-step builder that the
CPU equivalence tests share with the GPU tests and the kernel benchmark."""

import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
for _p in (os.path.join(_ROOT, "python"), os.path.join(_ROOT, "benchmark")):
    if _p not in sys.path:
        sys.path.insert(0, _p)
