"""Files of a run directory written whole or not at all.

Each file is written to a temporary file beside it (same directory, same filesystem) and
renamed over the old one, so a write that fails (a full disk, a read-only directory, an
interrupt) leaves the previous file as it was and no temporary file behind. The OSError it
raises names the file meant, which a failed write() alone does not.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path


def replace_file(path: Path, write: Callable[[Path], None]) -> None:
    """`write(tmp)` writes the new content to `tmp`, which then replaces `path`."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise OSError(e.errno, e.strerror or str(e), str(path)) from e
        raise


def write_text(path: Path, text: str) -> None:
    replace_file(path, lambda tmp: tmp.write_text(text))
