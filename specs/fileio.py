"""Writing files so that a kill at any moment leaves the old file or the new one, never half."""
from __future__ import annotations

import os
from pathlib import Path


def write_atomic(path, text: str) -> None:
    """Write via a temporary file in the same folder and rename over the target."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)
