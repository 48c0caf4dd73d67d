"""Validation only (never fitted on): NVIDIA's tuned Megatron-Bridge MoE recipes, pinned as the recipe
functions set them (tests/fixtures/megatron_bridge_moe_recipes.yaml, the recipes whose layout matches
a published performance-summary row), predicted by the shipped GPU model and set beside the
published tokens/s/GPU of that row.

    PYTHONPATH=$PWD python bench/recipe_rows.py [--png bench/results/recipe_rows.png]

Published figures: NVIDIA-NeMo/Megatron-Bridge docs/fern/versions/nightly/pages/performance-summary.mdx,
"26.04.01 NeMo Container" pre-training tables (the release of the calibration rows), copied below
per recipe. Three of them are the shared calibration rows (marked `cal`: the scale is fitted on
them, with the recipe flags of that release, cost_model/fit_default_calibration.py OVERRIDES; here
they are priced with the recipe functions' fields at the fixture's commit, which may differ). The
recipes megatron-core 0.16.1 cannot run are listed with the rule that refuses them (whole-iteration
CUDA graphs need sync-free dropless dispatch, Paged Stashing, after 0.16.1) and left out of the error.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml  # noqa: E402

import cost_model  # noqa: E402
from clusters import load_cluster  # noqa: E402
from cost_model.fit_default_calibration import OVERRIDES  # noqa: E402
from specs.fileio import write_png  # noqa: E402
from specs.models import load_model  # noqa: E402
from specs.stack import GPU_FULL, GPU_FULL_TE211  # noqa: E402
from specs.workload import Workload  # noqa: E402
from tests.test_nvidia_recipes import _plan  # noqa: E402
from tuner.space.megatron_rules import check  # noqa: E402

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "megatron_bridge_moe_recipes.yaml"
# recipe function -> published 26.04.01 tokens/s/GPU (performance-summary.mdx, 26.04.01 tables)
PUBLISHED_2604 = {
    "qwen3_30b_a3b_pretrain_16gpu_h100_fp8cs_config": 8960,
    "qwen3_235b_a22b_pretrain_256gpu_h100_fp8cs_config": 1712,
    "qwen3_30b_a3b_pretrain_8gpu_b200_fp8mx_config": 27136,
    "qwen3_30b_a3b_pretrain_8gpu_b300_fp8mx_config": 30720,
    "qwen3_30b_a3b_pretrain_8gpu_gb200_fp8mx_config": 26112,
    "qwen3_235b_a22b_pretrain_256gpu_gb200_fp8mx_config": 5680,
    "qwen3_30b_a3b_pretrain_8gpu_gb300_fp8mx_config": 31744,
    "qwen3_235b_a22b_pretrain_256gpu_gb300_fp8mx_config": 6944,
    "deepseek_v3_pretrain_256gpu_b200_fp8mx_config": 3328,
    "deepseek_v3_pretrain_256gpu_gb200_fp8mx_config": 4256,
    "gpt_oss_120b_pretrain_64gpu_h100_bf16_config": 5824,
    "gpt_oss_120b_pretrain_64gpu_b200_bf16_config": 13568,
    "gpt_oss_120b_pretrain_64gpu_b300_bf16_config": 15232,
    "gpt_oss_120b_pretrain_64gpu_gb200_bf16_config": 16640,
    "gpt_oss_120b_pretrain_64gpu_gb300_bf16_config": 19200,
}
CAL = {"qwen3_30b_a3b_pretrain_16gpu_h100_fp8cs_config", "deepseek_v3_pretrain_256gpu_b200_fp8mx_config",
       "gpt_oss_120b_pretrain_64gpu_h100_bf16_config"}


def _spec(r):
    """The model preset with the architecture fields a calibration row's source fills (attention
    window / sinks / expert bias of GPT-OSS, the MTP layer of DeepSeek-V3: the model's, not the GPU's)."""
    spec = load_model(r["model"])
    fills = {}
    for (model, _hw, _rel), (_p, spec_kw, _o, _s) in OVERRIDES.items():
        if model == r["model"]:
            fills.update({k: v for k, v in spec_kw.items() if not getattr(spec, k)})
    if r.get("mtp_num_layers") is not None:
        fills["mtp_num_layers"] = r["mtp_num_layers"]
    return dataclasses.replace(spec, **fills) if fills else spec


def _plot(points, path: Path, mape_held: float) -> None:
    """Predicted against published tokens/s/GPU, one dot per priced recipe (calibration rows hollow),
    the diagonal and the issue's 12% band."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.5, 6))
    for name, pub, pred, cal in points:
        ax.scatter([pub], [pred], facecolors="none" if cal else "C0", edgecolors="C0")
        ax.annotate(name.replace("_pretrain", "").replace("_config", ""), (pub, pred), fontsize=6,
                    xytext=(3, 3), textcoords="offset points")
    vals = [p for _, a, b, _ in points for p in (a, b)]
    lo, hi = min(vals) * 0.7, max(vals) * 1.4
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
    ax.fill_between([lo, hi], [lo * 0.88, hi * 0.88], [lo * 1.12, hi * 1.12], color="0.9", label="±12%")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("published tokens/s/GPU (Megatron-Bridge 26.04.01 performance summary)")
    ax.set_ylabel("predicted tokens/s/GPU (shipped calibration)")
    ax.set_title(f"NVIDIA recipes pinned: MAPE {mape_held:.1%} on the non-calibration rows (hollow: calibration)",
                 fontsize=9)
    ax.legend(loc="upper left")
    fig.tight_layout()
    write_png(fig, path, dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--png", type=Path, default=None, help="also write the predicted-vs-published plot here")
    a = ap.parse_args(argv)
    recipes = {r["recipe"].split(":")[1]: r for r in yaml.safe_load(FIXTURE.read_text())}
    points = []
    print(f"{'recipe':52s} {'published':>9s} {'predicted':>9s} {'error':>7s}")
    errs, held = [], []
    for name, pub in PUBLISHED_2604.items():
        r = recipes[name]
        w = Workload(_spec(r), load_cluster(r["gpu"], r["gpus"]), r["gbs"], r["seq"])
        p = _plan(r)
        profile = GPU_FULL_TE211 if (p.delay_wgrad and p.cuda_graph_impl == "transformer_engine") else GPU_FULL
        refused = sorted({x.code for x in check(w, p, profile)})
        if refused:
            print(f"{name:52s} {pub:9d} {'refused':>9s}         ({', '.join(refused)})")
            continue
        pred = cost_model.predict(w, p, offload_modules=tuple(r.get("offload_modules") or ()))
        tok = float(pred.tokens_per_s_per_gpu)
        e = tok / pub - 1
        errs.append(e)
        points.append((name, pub, tok, name in CAL))
        if name not in CAL:
            held.append(e)
        fit = "" if pred.feasible else "  (predicted over memory)"
        print(f"{name:52s} {pub:9d} {tok:9.0f} {e:+7.1%}{'  cal' if name in CAL else ''}{fit}")
    mape = lambda v: sum(abs(x) for x in v) / max(len(v), 1)  # noqa: E731
    print(f"MAPE over {len(errs)} priced recipes {mape(errs):.1%}; over the {len(held)} that are not "
          f"calibration rows {mape(held):.1%}")
    if a.png:
        _plot(points, a.png, mape(held))
        print(f"wrote {a.png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
