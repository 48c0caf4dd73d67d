"""`moetune adjudicate STUDY`: verify a study's pre-registration and give the pre-registered verdict.

  moetune adjudicate quickstart [--study-dir DIR] [--storage URL]

The pre-registration's hashes are checked first (file bytes against the `.sha256` sidecar, and the
embedded canonical-JSON hash); a modified or unverifiable file is refused: one line, exit 2. Then
the verdict is printed as it is: PASS (exit 0) when the best measured searched plan reaches the
pre-registered bar (>= 0.98 x the measured baseline), FAIL (exit 1) otherwise, INCOMPLETE (exit 1)
when the baseline or no searched plan was measured.
"""
from __future__ import annotations

from pathlib import Path

from specs.errors import UsageError

DESCRIPTION = ("Verify a study's pre-registration against its hashes and print the pre-registered verdict: "
               "PASS (exit 0), or FAIL or INCOMPLETE (exit 1).")


def add_parser(subparsers):
    p = subparsers.add_parser("adjudicate", help="Verify a study's pre-registration and print PASS or FAIL.",
                              description=DESCRIPTION)
    p.add_argument("study", help="Name of the study made by `moetune tune`.")
    p.add_argument("--study-dir", default=None,
                   help="Folder holding the study's pre-registration (default: studies/<study>).")
    p.add_argument("--storage", default=None,
                   help="Optuna storage of the study: an SQLAlchemy URL or journal:<path> "
                        "(default: SQLite in the study folder).")
    return p


def run(args) -> int:
    from specs.inputs import safe_name
    from tuner import prereg
    from tuner import study as study_mod
    from tuner.report import adjudicate
    safe_name(args.study, "study", "study name", UsageError)
    d = Path(args.study_dir) if args.study_dir else study_mod.default_study_dir(args.study)
    study_mod.check_storage(args.storage, d)
    try:
        doc = prereg.load(d)
    except prereg.PreregistrationError as e:
        raise UsageError(f"pre-registration refused: {e}") from None
    if doc["study"] != args.study:
        raise UsageError(f"{d} pre-registers study {doc['study']!r}, not {args.study!r}")
    storage = study_mod.open_storage(args.storage, d, heartbeat_interval=None)
    try:
        study = study_mod.load_study(args.study, storage)
    except KeyError:
        raise UsageError(f"no study {args.study!r} in {study_mod.redact_url(args.storage or study_mod.default_storage_url(d))}") from None
    v = adjudicate(study_mod.trial_rows(study), doc)
    print(f"pre-registration {d / prereg.NAME} verified (sha256 {doc['sha256']})")
    if v["baseline"] is not None:
        print(f"baseline  #{v['baseline']['number']} {v['baseline']['measured_tokens_per_s_per_gpu']:.1f} "
              f"tok/s/GPU  {doc['baseline']['plan']}")
    if v["best"] is not None:
        print(f"best      #{v['best']['number']} {v['best']['measured_tokens_per_s_per_gpu']:.1f} "
              f"tok/s/GPU  {v['best']['plan']}")
    print(v["line"])
    return 0 if v["verdict"] == "PASS" else 1
