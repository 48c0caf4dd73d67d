"""Regenerate `regression_predictions.json`: 50 fixed plans over five GPU workloads, their
predictions (shipped tables, shipped calibration), the emitted Megatron script of the first plan of
each workload, and the plan-space counts. Run once before a refactor; the test
`tests/test_regression.py` then asserts byte-identical output. Only rerun it on purpose, when a
change to the model's numbers is intended, and say so in the commit.

    MOETUNE_HOME=$(mktemp -d) python tests/data/make_regression_fixture.py

With `--keep-plans` the fixture's own plans are kept (re-written in the current canonical form)
and only their predictions, the emitted scripts and the counts are recomputed: what a change that
adds plan fields or options uses, so that every changed value can be traced to the change.
"""
from __future__ import annotations

import itertools
import json
from pathlib import Path

import cost_model
from clusters import load_cluster
from specs.models import load_model
from specs.stack import profile_for
from specs.workload import Workload
from tuner.emit import megatron_script
from tuner.space import default_space, iter_realizable, summarize

OUT = Path(__file__).with_name("regression_predictions.json")
# (model, cluster, gpus, gbs, seq, precision, stride): GPU clusters only, so the fixture does not
# depend on the host (cpu-local reads this machine's cores).
WORKLOADS = [
    ("mixtral-8x7b", "h100-sxm", 64, 256, 4096, "bf16", 7919),
    ("deepseek-v3", "h100-sxm", 1024, 8192, 4096, "fp8", 1000003),
    ("qwen3-30b-a3b", "h100-sxm", 16, 512, 4096, "fp8", 911),
    ("gpt-oss-120b", "b200", 64, 512, 4096, "bf16", 4099),
    ("qwen3-235b-a22b", "gb200-nvl72", 256, 2048, 4096, "bf16", 200003),
]
PER_WORKLOAD = 10


def workload(model, cluster, gpus, gbs, seq):
    return Workload(load_model(model), load_cluster(cluster, gpus), gbs, seq)


def sample(w, precision, stride):
    prof = profile_for(w.cluster, "gpu-full")
    space = default_space(w, prof, precision)
    plans = iter_realizable(space, w, prof)
    return [p for p in itertools.islice(plans, 0, stride * PER_WORKLOAD, stride)], prof, space


def predictions_of(entry) -> list[dict]:
    w = workload(*entry["workload"][:5])
    from specs.plan import Plan
    plans = [Plan.parse(s) for s in entry["plans"]]
    return [p.to_dict() for p in cost_model.predict_many(w, plans)]


def main() -> None:
    import sys
    keep = "--keep-plans" in sys.argv[1:]
    old = {tuple(e["workload"]): e["plans"] for e in json.loads(OUT.read_text())} if keep else {}
    out = []
    for model, cluster, gpus, gbs, seq, precision, stride in WORKLOADS:
        w = workload(model, cluster, gpus, gbs, seq)
        if keep:
            from specs.plan import Plan
            prof = profile_for(w.cluster, "gpu-full")
            space = default_space(w, prof, precision)
            plans = [Plan.parse(s) for s in old[(model, cluster, gpus, gbs, seq, precision)]]
        else:
            plans, prof, space = sample(w, precision, stride)
        assert len(plans) == PER_WORKLOAD, (model, len(plans))
        entry = {"workload": [model, cluster, gpus, gbs, seq, precision],
                 "plans": [p.canonical() for p in plans]}
        entry["predictions"] = predictions_of(entry)
        entry["emitted"] = megatron_script(w, plans[0], prof)
        if gpus <= 64:
            s = summarize(space, w, prof)
            entry["counts"] = {"total": s.total, "realizable": s.realizable,
                               "rejections": dict(sorted(s.rejections.items()))}
        out.append(entry)
    OUT.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
