"""Pre-registration of a study's predictions (moefs: hashed before the first trial, never rewritten).

`<study dir>/preregistration.json` holds the plans to be tried and the baseline, each with its
predicted step time, throughput and memory; the acceptance bar; the sha256 of the model spec and
cluster, the tables digest, the calibration id and hash, the code version (git describe + sha256 of
every package's files). Integrity, two ways:
- `sha256` inside the file: sha256 of the canonical JSON (sorted keys, no whitespace) of the
  document without that field;
- the sidecar `preregistration.sha256`: sha256 of the file's bytes, `sha256sum` format.
Written atomically and durably (`specs.fileio.write_atomic`: tmp file + fsync + link/rename); `write`
refuses to replace an existing file, and of two processes registering at once exactly one succeeds.
"""
from __future__ import annotations

import hashlib
import json
import subprocess
import time
from pathlib import Path

from specs.fileio import write_atomic

FORMAT = "moetune-preregistration/1"
NAME = "preregistration.json"
SIDECAR = "preregistration.sha256"
ACCEPTANCE_RATIO = 0.98
REPO_ROOT = Path(__file__).resolve().parents[2]  # tuner/study/prereg.py -> the repository
# Every package of the distribution (pyproject's [tool.setuptools.packages.find]; a test keeps the
# two lists equal): each computes part of a prediction - plan semantics and the SGLang defaults
# (specs), cluster data and shipped tables (clusters), the model (cost_model), the kernel what-ifs
# (kernels), the trial stacks' limits (trials), completion, rules and ranking (tuner).
SOURCE_DIRS = ("specs", "clusters", "cost_model", "kernels", "trials", "tuner")


class PreregistrationError(Exception):
    """A pre-registration that is missing or does not verify."""


def canonical_hash(doc: dict) -> str:
    """sha256 of the canonical JSON (sorted keys, no whitespace) of `doc` without its `sha256`."""
    body = {k: v for k, v in doc.items() if k != "sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def calibration_dict(cal) -> dict:
    """A calibration (`cost_model.calibration.Calibration`, training's or serving's) as a dict."""
    return cal.to_dict()


def code_version() -> dict:
    """{'describe': git describe (or the installed version), 'source_sha256': hash of the packages'
    files, sources and data alike (a preset's YAML or a shipped table predicts as much as code)}."""
    h = hashlib.sha256()
    for d in SOURCE_DIRS:
        for p in sorted((REPO_ROOT / d).rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts:
                h.update(str(p.relative_to(REPO_ROOT)).encode())
                h.update(p.read_bytes())
    try:
        desc = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=REPO_ROOT, text=True,
                              capture_output=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        desc = ""
    if not desc:
        try:
            from importlib.metadata import version
            desc = "moetune " + version("moetune")
        except Exception:  # noqa: BLE001
            desc = "unknown"
    return {"describe": desc, "source_sha256": h.hexdigest()}


def build(*, study: str, workload, precision: str, plans: list[dict], baseline: dict,
          baseline_source: str, tables_digest: str, calibration, trials_budget: int,
          sampler: str, space: dict, workload_fields: dict | None = None,
          adjudication: dict | None = None) -> dict:
    """The pre-registration document, with its embedded `sha256`.

    Args:
        study: study name. workload: the Workload. precision: the --precision asked for.
        plans: the candidates, best predicted first: dicts with plan, rank and predictions.
        baseline: the baseline's plan and predictions. baseline_source: where it came from.
        tables_digest: digest of the tables predicted with. calibration: the Calibration used.
        trials_budget: searched trials to run. sampler: the proposer's name.
        space: what was screened (level, counts).
        workload_fields: the `workload` entry, when it is not a training Workload's (a serving
            study's isl / osl / concurrency); the model and cluster hashes come from `workload`.
        adjudication: the verdict's protocol (`tuner.study.verdict.protocol`: rounds of the interleaved
            re-measurement, bootstrap size, seed, bar, interval); its bar is the acceptance ratio.
    """
    cal = calibration_dict(calibration)
    cal_hash = hashlib.sha256(json.dumps(cal, sort_keys=True).encode()).hexdigest()
    doc = {
        "format": FORMAT,
        "study": study,
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "workload": workload_fields or {"model": workload.model.name, "cluster": workload.cluster.kind,
                                        "devices": workload.world, "gbs": workload.gbs, "seq": workload.seq,
                                        "precision": precision},
        "hashes": {"model_spec_sha256": workload.model.digest(),
                   "cluster_sha256": workload.cluster.digest(),
                   "tables_digest": tables_digest,
                   "calibration_id": calibration.id, "calibration_sha256": cal_hash,
                   "code": code_version()},
        "acceptance": ({"ratio": adjudication["bar"], "rule": adjudication["rule"]} if adjudication else
                       {"ratio": ACCEPTANCE_RATIO,
                        "rule": "best measured tokens/s/GPU over searched plans >= "
                                f"{ACCEPTANCE_RATIO} x the baseline plan's measured tokens/s/GPU"}),
        "baseline": {**baseline, "source": baseline_source},
        "plans": plans,
        "trials_budget": trials_budget,
        "sampler": sampler,
        "space": space,
    }
    if adjudication:
        doc["adjudication"] = adjudication
    doc["sha256"] = canonical_hash(doc)
    return doc


def write(study_dir: str | Path, doc: dict) -> Path:
    """Register `doc` in `study_dir` (created if missing); returns the JSON file's path.

    The JSON is created exclusively (`write_atomic(..., exclusive=True)`): if a pre-registration is
    already there, from this process or a concurrent tuner, PreregistrationError is raised and
    nothing is written. The sidecar with the file's sha256 follows; `load` waits briefly for it.
    """
    d = Path(study_dir)
    path = d / NAME
    if path.exists():
        raise PreregistrationError(f"{path} exists; a pre-registration is never rewritten")
    data = (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()
    side = f"{hashlib.sha256(data).hexdigest()}  {NAME}\n".encode()
    try:
        write_atomic(path, data, fsync=True, exclusive=True)
    except FileExistsError:
        raise PreregistrationError(f"{path} exists; a pre-registration is never rewritten") from None
    write_atomic(d / SIDECAR, side, fsync=True)
    return path


def load(study_dir: str | Path) -> dict:
    """Read and verify; raises PreregistrationError with one clear sentence if it does not verify."""
    d = Path(study_dir)
    path = d / NAME
    if not path.exists():
        raise PreregistrationError(f"no pre-registration at {path}")
    data = path.read_bytes()
    side = d / SIDECAR
    for _ in range(20):  # a concurrent writer links the JSON first, then the sidecar
        if side.exists():
            break
        time.sleep(0.1)
    if not side.exists():
        raise PreregistrationError(f"{side} is missing: the pre-registration cannot be verified")
    want = side.read_text().split()[0] if side.read_text().split() else ""
    got = hashlib.sha256(data).hexdigest()
    if got != want:
        raise PreregistrationError(f"{path} was modified after registration "
                                   f"(sha256 {got[:16]}... != registered {want[:16]}...)")
    try:
        doc = json.loads(data)
    except json.JSONDecodeError as e:
        raise PreregistrationError(f"{path} is not valid JSON: {e}") from None
    if doc.get("sha256") != canonical_hash(doc):
        raise PreregistrationError(f"{path}: embedded sha256 does not match its content")
    return doc
