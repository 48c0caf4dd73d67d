"""Writing files so that a kill at any moment leaves the old file or the new one, never half.

Every writer of a file that another process may read while it is written (reports, calibrations,
pre-registrations, profile tables, emitted scripts) goes through `write_atomic`.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def _read_umask() -> int:
    # os.umask can only be read by setting it; do it once, at import, not while threads write files.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _read_umask()


def write_atomic(path, data: str | bytes, *, fsync: bool = False, exclusive: bool = False) -> Path:
    """Write `data` to `path` through a temporary file in the same folder, then rename it in place.

    Args:
        path: the file to write; its folder is created if missing.
        data: text (written as UTF-8) or bytes.
        fsync: flush the file's bytes (and, after the rename, the folder entry) to the disk before
            returning, so that a power cut cannot leave the new name pointing at empty blocks.
            Worth its cost for records that must survive (a pre-registration); not for reports.
        exclusive: create `path` only if it does not exist: the temporary file is hard-linked to the
            name, which fails atomically when another process created it first (then
            `FileExistsError` is raised and nothing is changed). Without it the target is replaced.

    Returns:
        `path` as a Path.

    The temporary name is unique per call (`tempfile.mkstemp`), so two processes writing the same
    target never share a temporary file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    blob = data.encode() if isinstance(data, str) else bytes(data)
    try:
        fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:  # name the file the user asked for, not our temporary one
        raise OSError(e.errno, e.strerror, str(path)) from e
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        # mkstemp creates the file 0600; give it the permissions an ordinary open() would have.
        os.chmod(tmp, 0o666 & ~_UMASK)
        if exclusive:
            os.link(tmp, path)  # FileExistsError if the name exists: never overwrites
        else:
            os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    if fsync:
        _fsync_dir(path.parent)
    return path


def _fsync_dir(directory: Path) -> None:
    """Persist a folder's entries (the rename); a no-op where folders cannot be opened (Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse fsync on a folder; the data itself is already synced
    finally:
        os.close(fd)


def write_png(fig, path, *, dpi: int = 110) -> Path:
    """Save a matplotlib figure as a PNG through `write_atomic` (two writers of one report never
    interleave bytes; a kill leaves the old plot or the new one) and close it. The one way every
    plot of moetune is written."""
    import io

    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return write_atomic(path, buf.getvalue())
