"""`moetune adjudicate STUDY`: verify a study's pre-registration and give the pre-registered verdict.

  moetune adjudicate quickstart [--study-dir DIR] [--storage URL]

The storage is opened read-only (nothing is created or written).
Refused (one line, exit 2) when the pre-registration does not verify: its bytes against the
`.sha256` sidecar, the embedded canonical-JSON hash, the hash the study recorded when its first
tuner started (`preregistration_sha256`: a file rewritten with fresh hashes afterwards does not
match it), and its adjudication protocol (well formed; the study's re-measurements follow it: the
selection rounds of the top measured plans, the winner they chose, rounds and A B A B order). Then the verdict, recomputed from the stored
measurements by the protocol (tuner/study/verdict.py): PASS (exit 0) when the bootstrap interval of
winner / baseline throughput lies at or above the bar, FAIL (exit 1) below it, INCONCLUSIVE
(exit 1) when it straddles the bar, INCOMPLETE (exit 1) when the baseline, the winner or two
rounds of re-measurement are missing. A study pre-registered without a protocol is judged on
its single measurements, as before.
"""
from __future__ import annotations

from pathlib import Path

from specs.errors import UsageError

DESCRIPTION = ("Verify a study's pre-registration (hashes and adjudication protocol) and print the "
               "pre-registered verdict: PASS (exit 0), or FAIL, INCONCLUSIVE or INCOMPLETE (exit 1).")


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
    from tuner.study import prereg as prereg
    from tuner.study import storage as study_mod
    from tuner.study.report import adjudicate
    safe_name(args.study, "study", "study name", UsageError)
    d = Path(args.study_dir) if args.study_dir else study_mod.default_study_dir(args.study)
    try:
        doc = prereg.load(d)
    except prereg.PreregistrationError as e:
        raise UsageError(f"pre-registration refused: {e}") from None
    if doc["study"] != args.study:
        raise UsageError(f"{d} pre-registers study {doc['study']!r}, not {args.study!r}")
    shown = study_mod.redact_url(args.storage or study_mod.default_storage_url(d))
    try:  # read-only: a wrong --storage creates nothing
        storage = study_mod.open_storage_readonly(args.storage, d)
    except FileNotFoundError as e:
        raise UsageError(f"{e} (give the study's --storage, as `moetune tune` printed it)") from None
    except Exception as e:  # noqa: BLE001 - bad URL, missing driver, unreachable server: one line
        raise UsageError(f"--storage {shown}: cannot be opened read-only ({type(e).__name__})") from None
    try:
        study = study_mod.load_study(args.study, storage)
    except KeyError:
        raise UsageError(f"no study {args.study!r} in {study_mod.redact_url(args.storage or study_mod.default_storage_url(d))}") from None
    from tuner.study.storage import REMEASURED
    from tuner.study.verdict import ProtocolError
    recorded = study.user_attrs.get("preregistration_sha256")
    if recorded is not None and recorded != doc["sha256"]:
        raise UsageError(f"pre-registration refused: {d / prereg.NAME} has sha256 {doc['sha256'][:16]}..., the "
                         f"study ran under {recorded[:16]}...")
    remeasured = study.user_attrs.get(REMEASURED, [])
    try:
        v = adjudicate(study_mod.trial_rows(study), doc, remeasured)
    except ProtocolError as e:
        raise UsageError(f"pre-registration refused: {e}") from None
    print(f"pre-registration {d / prereg.NAME} verified (sha256 {doc['sha256']})")
    if v["baseline"] is not None:
        print(f"baseline  #{v['baseline']['number']} {v['baseline']['measured_tokens_per_s_per_gpu']:.1f} "
              f"tok/s/GPU  {doc['baseline']['plan']}")
    if v["best"] is not None:
        print(f"best      #{v['best']['number']} {v['best']['measured_tokens_per_s_per_gpu']:.1f} "
              f"tok/s/GPU  {v['best']['plan']}")
    for m in remeasured:
        phase = "select " if m.get("phase") == "select" else ""
        print(f"{phase}round {m['round'] + 1} {m['role']:9s} " + (f"{m['tokens_per_s_per_gpu']:.1f} tok/s/GPU  steps "
              + " ".join(f"{x:.4f}" for x in m.get("step_times_s", ())) if m.get("ok") else f"FAIL {m.get('kind')}"))
    print(v["line"])
    return 0 if v["verdict"] == "PASS" else 1
