"""`python -m sglang_mixgraph.cli`: the console script where it is not installed."""

import sys

from sglang_mixgraph.cli import main

sys.exit(main())
