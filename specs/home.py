"""Where moetune keeps user state: $MOETUNE_HOME (default ~/.moetune).

One rule for every layer: measured tables (`tables/<kind>/`), fitted calibrations
(`calibration/<kind>.json`), measured kernel grids and tables (`kernels/<kind>/`), Ray tokens.
"""
from __future__ import annotations

import os
from pathlib import Path


def moetune_home() -> Path:
    """The user-state root: $MOETUNE_HOME when set and non-empty, else ~/.moetune."""
    return Path(os.environ.get("MOETUNE_HOME") or "~/.moetune").expanduser()
