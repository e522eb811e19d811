"""The one way files are replaced on disk: write a temporary sibling, fsync it, rename it over
the target, fsync the directory. A reader (or a process restarted after ``kill -9`` or a power
loss) sees either the old file or the new one, never a mix.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

Content = bytes | Callable[[BinaryIO], None]
"""The bytes to write, or a function that writes them into the open file (e.g. ``np.savez``)."""


def fsync_dir(path: Path) -> None:
    """Make a rename or a new entry in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_synced(path: Path, content: Content) -> None:
    """Write ``path`` (created or truncated) and fsync it; no rename (for fresh staging files)."""
    with open(path, "wb") as f:
        if isinstance(content, bytes):
            f.write(content)
        else:
            content(f)
        f.flush()
        os.fsync(f.fileno())


def write_atomic(path: Path, content: Content) -> None:
    """Replace ``path`` atomically and durably with ``content`` (see the module docstring)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        write_synced(tmp, content)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
