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


def add_parser(subparsers):
    p = subparsers.add_parser("adjudicate", help="verify a study's pre-registration and print PASS/FAIL",
                              description=__doc__.splitlines()[0])
    p.add_argument("study", help="study name")
    p.add_argument("--study-dir", default=None, help="study directory (default: studies/<study>)")
    p.add_argument("--storage", default=None, help="Optuna storage (default: sqlite in the study dir)")
    return p


def run(args) -> int:
    from tuner import prereg as PR
    from tuner import study as S
    from tuner.report import adjudicate

    d = Path(args.study_dir or Path("studies") / args.study)
    try:
        doc = PR.load(d)
    except PR.PreregistrationError as e:
        raise UsageError(f"pre-registration refused: {e}") from None
    if doc["study"] != args.study:
        raise UsageError(f"{d} pre-registers study {doc['study']!r}, not {args.study!r}")
    storage = S.open_storage(args.storage, d)
    import optuna
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = optuna.load_study(study_name=args.study, storage=storage)
    except KeyError:
        raise UsageError(f"no study {args.study!r} in {args.storage or S.default_storage_url(d)}") from None
    v = adjudicate(S.trial_rows(study), doc)
    print(f"pre-registration {d / PR.NAME} verified (sha256 {doc['sha256']})")
    if v["baseline"] is not None:
        print(f"baseline  #{v['baseline']['number']} {v['baseline']['measured_tokens_per_s_per_gpu']:.1f} "
              f"tok/s/GPU  {doc['baseline']['plan']}")
    if v["best"] is not None:
        print(f"best      #{v['best']['number']} {v['best']['measured_tokens_per_s_per_gpu']:.1f} "
              f"tok/s/GPU  {v['best']['plan']}")
    print(v["line"])
    return 0 if v["verdict"] == "PASS" else 1
