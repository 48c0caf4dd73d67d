"""How much of a held-out CPU run's error is one uniform host-speed shift, and how much is the plan.

    python bench/heldout_cpu_shift.py bench/results/heldout_cpu_runs/*/heldout.csv

For each held-out report written by `bench/heldout_cpu.py` (OUT/heldout.csv) it prints the errors
as reported (the study's calibration, the issue-10 criterion) and a DIAGNOSTIC that is not the
criterion: the geometric-mean factor g = measured / predicted over the run's own held-out plans
and the errors left after dividing every prediction's error by that one factor. g - 1 is the part of
the error that moves every plan alike: the host ran at another speed during the held-out trials than
during the study whose trials set the calibration (on this 2-vCPU VM the speed drifts by 20-35%
within minutes, see bench/heldout_cpu_run.sh's probes). What is left after it is the part that a
better cost model could remove. g is fitted on the held-out set itself, so it is never a prediction.
"""
from __future__ import annotations

import csv
import math
import sys
from pathlib import Path


def analyse(path: Path) -> dict:
    rows = list(csv.DictReader(path.open()))
    pred = [float(r["predicted_s"]) for r in rows]
    meas = [float(r["measured_s"]) for r in rows]
    err = [p / m - 1 for p, m in zip(pred, meas)]
    g = math.exp(sum(math.log(m / p) for p, m in zip(pred, meas)) / len(rows))
    left = [p * g / m - 1 for p, m in zip(pred, meas)]
    return dict(run=path.parent.name, plans=[r["plan_short"] + f" s{r['seq']}" for r in rows], err=err, g=g, left=left)


def main(argv=None) -> int:
    paths = [Path(p) for p in (argv if argv is not None else sys.argv[1:])]
    if not paths:
        print(__doc__.splitlines()[2].strip(), file=sys.stderr)
        return 2
    for p in paths:
        if not p.is_file():
            print(f"heldout_cpu_shift: no such report: {p}", file=sys.stderr)
            return 2
    res = [analyse(p) for p in paths]
    plans = res[0]["plans"]
    print(f"{'plan':58s} " + " ".join(f"{r['run'][:13]:>13s}" for r in res))
    for i, name in enumerate(plans):
        print(f"{name:58s} " + " ".join(f"{r['err'][i]:+6.1%}/{r['left'][i]:+6.1%}" for r in res))
    print(f"{'max |error| as reported / after the uniform factor':58s} "
          + " ".join(f"{max(map(abs, r['err'])):6.1%}/{max(map(abs, r['left'])):6.1%}" for r in res))
    print(f"{'uniform factor g (measured / predicted, geometric mean)':58s} "
          + " ".join(f"{r['g']:13.3f}" for r in res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
