"""Where plain TP8 ranks among the serving plans `plans --mode serve --rank` scores, and by how much
the winner is predicted to beat it, with the spread the model's own error implies.

    python bench/serving_rank_vs_tp8.py [--model deepseek-r1] [--cluster h200-sxm] [--gpus 8]
        [--isl 1000] [--osl 1000] [--concurrency 64 8] [--precision fp8]

DeepSeek-R1 is the deepseek-r1 preset (DeepSeek-V3's architecture). Plans are grouped by layout (tp, pp, dp,
attn_dp, ep, a2a, deepep mode, TBO, EPLB, pd; the best knobs of each layout represent it). "Plain TP8"
is tp=8 with everything else at SGLang's defaults. The spread: the shipped per-phase serving
calibration's leave-one-out log error s (`resid_sd` of cost_model/serving/calibration_default.json,
fitted on the shared rows only); a ratio of two predictions with independent errors of that size is
uncertain by exp(+-sqrt(2) s) (an upper bound: errors of two plans on one machine are correlated).
"""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

from cost_model.calibration import Calibration
from specs.serve_plan import ServePlan

LAYOUT = ("tp", "pp", "dp", "attn_dp", "ep", "a2a", "deepep_mode", "tbo", "eplb_redundant", "pd")
CAL = Path(__file__).resolve().parent.parent / "cost_model" / "serving" / "calibration_default.json"


def layout(p: ServePlan) -> str:
    d = ServePlan()
    return ",".join(f"{f}={getattr(p, f)}" for f in LAYOUT if getattr(p, f) != getattr(d, f)) or "tp=1"


def spread() -> float:
    return float(Calibration.load(CAL).resid_sd)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="deepseek-r1")
    ap.add_argument("--cluster", default="h200-sxm")
    ap.add_argument("--gpus", default="8")
    ap.add_argument("--isl", default="1000")
    ap.add_argument("--osl", default="1000")
    ap.add_argument("--concurrency", nargs="+", default=["64", "8"])
    ap.add_argument("--precision", default="fp8")
    a = ap.parse_args(argv)
    s = spread()
    band = math.exp(math.sqrt(2) * s)
    print(f"model error: leave-one-out log-sd {s:.3f} of the per-phase calibration -> a ratio of two predictions "
          f"within x/{band:.2f}")
    for conc in a.concurrency:
        out = subprocess.run([sys.executable, "-m", "tuner.cli", "plans", "--mode", "serve", "--model", a.model,
                              "--cluster", a.cluster, "--gpus", a.gpus, "--isl", a.isl, "--osl", a.osl,
                              "--concurrency", conc, "--precision", a.precision, "--rank", "--top", "1000000",
                              "--examples", "0", "--json"], capture_output=True, text=True, check=True).stdout
        d = json.loads(out)["ranked"]
        best: dict = {}
        for i, r in enumerate(d["plans"]):
            best.setdefault(layout(ServePlan.parse(r["plan"])), (i, r))
        lays = sorted(best.items(), key=lambda kv: kv[1][0])
        names = [k for k, _ in lays]
        print(f"\nconcurrency {conc}: {d['scored']} distinct effective plans scored, {len(d['plans'])} feasible, "
              f"{len(lays)} layouts")
        for n, (k, (_i, r)) in enumerate(lays[:5]):
            print(f"  #{n + 1} {r['objective']:7.1f} tok/s/GPU  TPOT {r['tpot_p90_s'] * 1e3:5.1f} ms  {k}")
        if "tp=8" not in best:
            print("  plain TP8: not feasible")
            continue
        i8, r8 = best["tp=8"]
        win = lays[0][1][1]["objective"]
        ratio = win / r8["objective"]
        print(f"  plain TP8: layout #{names.index('tp=8') + 1} of {len(lays)} (plan #{i8 + 1}), "
              f"{r8['objective']:.1f} tok/s/GPU; winner/TP8 = {ratio:.3f} "
              f"(model-error range {ratio / band:.2f}-{ratio * band:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
