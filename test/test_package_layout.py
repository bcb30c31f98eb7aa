"""What the server runs imports nothing of `sglang_mixgraph.reference` (tests and benchmarks only)."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_serving_code_does_not_import_the_references():
    code = textwrap.dedent(
        """
        import sys
        from sglang_mixgraph.patches import all_patches
        from sglang_mixgraph.patches.mixed_split import forward, plan, state  # noqa: F401
        from sglang_mixgraph import cli, graph_plan, plugin  # noqa: F401
        assert all_patches()
        print(sorted(m for m in sys.modules if m.startswith("sglang_mixgraph.")))
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = proc.stdout
    assert "sglang_mixgraph.core.mixed_boundary" in loaded  # the test can see imports
    assert "sglang_mixgraph.reference" not in loaded
