"""Reading the files a user hands in (model and cluster YAML, config.json, tables, calibrations, CSVs).

One rule for each way a file can be unusable before its content is even looked at, so that every
loader answers the same one line: a missing file, a folder where a file was expected, a file that
cannot be read, bytes that are not UTF-8, a YAML mapping with a key given twice (YAML's own rule is
"the last one wins", which hides typos). Loaders then check the content against their noun.
"""
from __future__ import annotations

import math
from pathlib import Path

import yaml

from specs.errors import InputError, SpecError


def read_text(path, what: str = "file", error: type[InputError] = SpecError) -> str:
    """The text of `path` (UTF-8), or `error` naming the file and what is wrong with it.

    Args:
        path: the file.
        what: what the file should be, for the message ("model YAML", "runs CSV").
        error: the InputError kind the caller's users see (its flag is added by the CLI).
    """
    p = Path(path)
    if p.is_dir():
        raise error(f"{p}: is a folder, expected a {what}")
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise error(f"{p}: cannot read {what} (no such file)") from None
    except OSError as e:
        raise error(f"{p}: cannot read {what} ({e.strerror or e})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{p}: not a text {what} (byte {e.start} is not UTF-8)") from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a mapping key given twice."""


def _construct_mapping(loader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            dup = key in seen
        except TypeError:  # an unhashable key; SafeLoader's own error follows
            continue
        if dup:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} is given twice (line {key_node.start_mark.line + 1})", key_node.start_mark)
        seen.add(key)
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_yaml(path, what: str = "YAML file", error: type[InputError] = SpecError):
    """The parsed content of a YAML file (`read_text`'s checks, then YAML with unique keys)."""
    text = read_text(path, what, error)
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        problem, mark = getattr(e, "problem", None), getattr(e, "problem_mark", None)
        if problem:
            detail = problem if mark is None or "line" in problem else \
                f"{problem} (line {mark.line + 1}, column {mark.column + 1})"
        else:
            detail = (str(e).strip().splitlines() or ["parse error"])[0]
        raise error(f"malformed YAML in {path}: {detail}") from None


# ---- field checks shared by the loaders -------------------------------------------------------

def as_int(value, field: str, where: str, *, lo: int | None = None, error: type[InputError] = SpecError) -> int:
    """`value` as an int when it is a whole number (not a bool, not a string), else `error`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            (isinstance(value, float) and not (math.isfinite(value) and value == int(value))):
        raise error(f"{where}: {field} must be a whole number, got {value!r}")
    v = int(value)
    if lo is not None and v < lo:
        raise error(f"{where}: {field} must be >= {lo}, got {v}")
    return v


def as_float(value, field: str, where: str, *, lo: float | None = None, lo_open: bool = False,
             error: type[InputError] = SpecError) -> float:
    """`value` as a finite float (not a bool, not a string), >= lo (> lo with `lo_open`), else `error`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise error(f"{where}: {field} must be a finite number, got {value!r}")
    v = float(value)
    if lo is not None and (v <= lo if lo_open else v < lo):
        raise error(f"{where}: {field} must be {'>' if lo_open else '>='} {lo:g}, got {v:g}")
    return v


def as_bool(value, field: str, where: str, error: type[InputError] = SpecError) -> bool:
    if not isinstance(value, bool):
        raise error(f"{where}: {field} must be true or false, got {value!r}")
    return value


def as_str(value, field: str, where: str, error: type[InputError] = SpecError) -> str:
    if not isinstance(value, str):
        raise error(f"{where}: {field} must be a string, got {value!r}")
    return value


def safe_name(value, field: str, where: str, error: type[InputError] = SpecError) -> str:
    """A name that becomes one path component (a model's `name`, a cluster's `kind`, a study name):
    non-empty, at most 200 characters, no path separator, no control character, not "." or "..",
    and not starting with "." (so it can never climb out of, or hide in, the folder it is put in)."""
    v = as_str(value, field, where, error)
    bad = [c for c in v if c in "/\\" or ord(c) < 32 or ord(c) == 127]
    if not v.strip() or v.startswith(".") or bad or len(v) > 200:
        why = ("is empty" if not v.strip() else f"contains {bad[0]!r}" if bad else
               "starts with '.'" if v.startswith(".") else "is longer than 200 characters")
        shown = v if len(v) <= 60 else v[:57] + "..."
        raise error(f"{where}: {field} {shown!r} cannot name a file or folder ({why})")
    return v
