"""The workload the cost-model physics tests price: a preset model (fields overridden by keyword)
on `gpus` GPUs of a cluster preset; and a plan's uncalibrated breakdown on it."""
from __future__ import annotations

import dataclasses

from clusters import load_cluster
from specs.models import load_model
from specs.workload import Workload


def workload(model="qwen3-30b-a3b", kind="h100-sxm", gpus=16, gbs=64, seq=4096, **spec_kw) -> Workload:
    spec = load_model(model)
    if spec_kw:
        spec = dataclasses.replace(spec, **spec_kw)
    return Workload(spec, load_cluster(kind, gpus), gbs, seq)


def breakdown(w: Workload, plan, **kw) -> dict:
    """The plan's uncalibrated `breakdown_s` on `w` (`kw`: options of `cost_model.predict`)."""
    from cost_model import predict
    from cost_model.calibration import IDENTITY
    return predict(w, plan, calibration=IDENTITY, **kw).breakdown_s
