"""One-GPU check and sweep of the kernels/ Triton kernels (about 5 minutes at most on an H100/H200).

1. bf16 / fp16 correctness of `kernels.fused_moe` and `kernels.weave_kernel` against the torch
   reference (the CPU interpreter cannot check bf16).
2. A block-configuration sweep of the fused MoE kernel for the DeepSeek-V2-Lite expert shape at a
   few M, written as an SGLang 0.5.23 table (`<out>/sglang/configs/triton_X_Y_Z/E=..,N=..,device_name=...json`).
3. A (c, K) sweep of the persistent Weave-style kernel on this one GPU (EP = 1: the communication
   programs move the local permutation traffic), kept as a measured grid with provenance in
   `<out>/weave_grid_ep1.json`. Weave's section-3 model has no communication at EP 1, so this grid
   is not fed to the curve refit; it shows where the kernel's own (c, K) optimum lies.

    python bench/kernels_gpu_sweep.py [--out DIR] [--budget-s 270] [--tokens 4096]

Exits 2 with one line when no CUDA device is present. Writes `<out>/kernels_gpu_sweep.json`.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

def check_correctness(report):
    import torch

    from kernels.fused_moe import fused_moe, torch_reference
    from kernels.weave_kernel import weave_moe
    rows = []
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.bfloat16, torch.float16):
        for topk in (1, 2, 8):
            t, h, i, e = 200, 256, 128, 16
            x = (torch.randn(t, h, generator=g) * 0.5).to("cuda", dtype)
            w1 = (torch.randn(e, h, 2 * i, generator=g) / h ** 0.5).to("cuda", dtype)
            w2 = (torch.randn(e, i, h, generator=g) / i ** 0.5).to("cuda", dtype)
            probs = torch.ones(e - 2)
            probs[0] = 4.0
            ids = torch.stack([torch.multinomial(probs, topk, generator=g) for _ in range(t)]).cuda()
            w = torch.softmax(torch.randn(t, topk, generator=g), -1).cuda()
            ref = torch_reference(x, w1, w2, w, ids).float()
            scale = max(1.0, ref.abs().max().item())
            a = fused_moe(x, w1, w2, w, ids).float()
            b = weave_moe(x, w1, w2, w, ids, num_programs=torch.cuda.get_device_properties(0).multi_processor_count,
                          comm_programs=16, chunks=4, n_steal=2, block_m=64, block_n=64, block_k=64, block_h=256).float()
            rows.append({"dtype": str(dtype).split(".")[-1], "topk": topk,
                         "fused_moe_max_rel_err": (a - ref).abs().max().item() / scale,
                         "weave_max_rel_err": (b - ref).abs().max().item() / scale})
    tol = 3e-2
    report["correctness"] = {"tolerance": tol, "rows": rows,
                             "ok": all(r["fused_moe_max_rel_err"] < tol and r["weave_max_rel_err"] < tol for r in rows)}


def sweep_blocks(report, out: Path, deadline: float):
    from kernels.measure import sweep_block_configs
    from kernels.weave import LayerShape
    from specs.models import load_model
    shape = LayerShape.from_model(load_model("deepseek-v2-lite"))
    report["block_sweep"] = sweep_block_configs(shape, (64, 512, 4096), out / "sglang", deadline=deadline)


def sweep_weave(report, out: Path, tokens: int, deadline: float):
    import torch
    import triton

    from kernels.measure import cuda_median_ms
    from kernels.weave import LayerShape
    from kernels.weave_kernel import random_inputs, weave_moe
    from specs.models import load_model
    shape = LayerShape.from_model(load_model("deepseek-v2-lite"))
    n = torch.cuda.get_device_properties(0).multi_processor_count
    x, w1, w2, w, ids = random_inputs(shape, tokens, device="cuda", dtype=torch.bfloat16)
    points = []
    for c in range(8, n - 7, 16):
        for k in (1, 2, 4, 8):
            if time.time() > deadline:
                break
            ms = cuda_median_ms(lambda c=c, k=k: weave_moe(x, w1, w2, w, ids, num_programs=n, comm_programs=c, chunks=k,
                                            n_steal=0, block_m=64, block_n=64, block_k=64, block_h=256),
                          iters=5, warmup=2)
            points.append({"c": c, "K": k, "ms": round(ms, 6)})
    case = {"shape": {"num_experts": shape.num_experts, "topk": shape.topk, "hidden": shape.hidden,
                      "inter": shape.inter, "name": shape.name}, "tokens": tokens, "ep": 1, "skew": 1.0}
    prov = {"source": f"bench/kernels_gpu_sweep.py on {torch.cuda.get_device_name()}, triton {triton.__version__}",
            "sha256": hashlib.sha256(json.dumps({"case": case, "points": points}, sort_keys=True).encode()).hexdigest(),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    grid = {"kind": "this-gpu", "case": case, "points": points, "provenance": prov,
            "note": "EP 1 on one GPU: not used by the section-3 refit (no cross-GPU communication)"}
    (out / "weave_grid_ep1.json").write_text(json.dumps(grid, indent=1) + "\n")
    best = min(points, key=lambda p: p["ms"]) if points else None
    report["weave_sweep"] = {"points": len(points), "best": best, "grid": str(out / "weave_grid_ep1.json")}


def main() -> int:
    ap = argparse.ArgumentParser(description="Check and sweep the kernels/ Triton kernels on one GPU.")
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "bench" / "out" / "kernels"),
                    help="Folder for the report, the SGLang block table and the measured grid.")
    ap.add_argument("--budget-s", type=float, default=270.0, help="Wall-clock budget in seconds for the sweeps.")
    ap.add_argument("--tokens", type=int, default=4096, help="Tokens of the (c, K) sweep.")
    args = ap.parse_args()
    try:
        import torch
        if not torch.cuda.is_available():
            raise ImportError
    except ImportError:
        print("kernels_gpu_sweep: no CUDA device here", file=sys.stderr)
        return 2
    t0 = time.time()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"device": torch.cuda.get_device_name()}
    check_correctness(report)
    deadline = t0 + args.budget_s
    sweep_blocks(report, out, t0 + args.budget_s * 0.4)
    sweep_weave(report, out, args.tokens, deadline)
    report["wall_s"] = round(time.time() - t0, 1)
    (out / "kernels_gpu_sweep.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "block_sweep"}, indent=1))
    return 0 if report["correctness"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
