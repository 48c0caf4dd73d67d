"""Build the default (published-numbers) tables for every cluster preset: clusters/tables/<kind>/.

    python -m cost_model.build_default_tables [--kinds h100-sxm,my-cluster.yaml,...] [--out clusters/tables]

(a cluster YAML of a kind of its own: `--out $MOETUNE_HOME/tables`, where the cost model looks first)

Nothing here is hand-tuned: each family is a physical skeleton whose few parameters are either
datasheet values of the target GPU or fitted to public measurements (`cost_model/data/`, each row
with its source; the few used here are also copied below so the build reads as one file):

- gemm / grouped_gemm: a tiled roofline  t = (tc^p + tm^p)^(1/p),  tc = 2mnk / (peak * e_c * q),
  tm = bytes / (hbm * e_m), with q the tile/wave quantisation efficiency (128x128 output tiles,
  64-row tiles for m <= 64, waves over the SM count). (e_c, e_m, p) are least-squares fitted (log
  error) to DeepGEMM's H800 FP8 dense + grouped rows. Extrapolation: the same efficiencies are used
  for every other GPU, scaled by that GPU's datasheet peak, HBM bandwidth and SM count. bf16 uses
  2-byte operands and a compute efficiency solved from the measured maximum achievable matmul
  FLOPS of the GPU family (MAMF, H100_MAMF / MAMF_EFFICIENCY below). All twelve rows of
  cost_model/data/megatron_moe_layer_h100.csv are held out as test anchors (none is fitted).
- attention: FlashAttention fraction-of-peak vs sequence length and head dim (approximate reading
  of FlashAttention-3, arXiv:2407.08608, H100 bf16 causal), scaled by the bf16 peak; one constant
  bh (batch x heads per call, FA_BH) for every kind, cpu-local included: the axis is inert here and
  only a measured profile (`moetune profile`, CPU) fills it. A kind with published SDPA rows
  (PUBLISHED_ATTN_PLATFORM: GB200 <- arXiv 2603.07685 Table 9; GB300 <- cuDNN's own GB300 benchmark,
  cudnn-frontend) carries them at their own points and the curve scaled through them elsewhere.
- collectives: nccl-tests bus bandwidth. Scale-up peak = NVLink unidirectional GB/s x the H100
  ring all-reduce efficiency (370 / 450, nccl-tests issue 212); scale-out = members-per-node x
  per-NIC achievable (48.5 of 50 GB/s, nccl-tests issue 267) x a node-count factor fitted to the
  H100 2- and 4-node all-reduce rows (nccl issue 1221), capped at the scale-up value. Size ramp:
  busbw(S) = peak * S / (S + peak * latency) with an assumed base latency (documented per row).
- ep_dispatch: DeepEP / HybridEP normal-kernel bandwidth (DeepEP README, NeMo Automodel benchmark),
  scaled to the target by NVLink (scale-up) or NIC (scale-out) bandwidth ratio; alltoall rows are
  the NCCL all_to_all bus bandwidth of the collectives family. A kind with published per-call times
  (PUBLISHED_EP_HW: GB200 <- arXiv 2603.07685 Table 7, HybridEP and all-to-all) takes its scale-up
  rows solved from them instead (`published_ep_rows`).
- dispatch_gap (GPUs): the host seconds per launched kernel of a PyTorch-eager training step, from
  DeepSeek's public profiler trace (HOST_US_PER_LAUNCH below, a lower bound); cpu-local: assumed.
- membw: assumed values (no public measurement in the reference set), labelled so.
"""
from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from cost_model.constants import HOST_US_PER_LAUNCH
from cost_model.tables import TABLE_ROOT, write_family, write_meta

# --- public measurements (a copy of cost_model/data/deepgemm_h800_fp8.csv) ----------
DEEPGEMM_SRC = "deepseek-ai/DeepGEMM README @a9967bc (H800 SXM5 FP8)"
DEEPGEMM = [  # kind, groups, m_per_group, n, k, tflops
    ("grouped", 4, 8192, 4096, 7168, 1346), ("grouped", 4, 8192, 7168, 2048, 1214),
    ("grouped", 8, 4096, 4096, 7168, 1346), ("grouped", 8, 4096, 7168, 2048, 1214),
    ("grouped", 1, 1024, 4096, 7168, 1233), ("grouped", 1, 1024, 7168, 2048, 925),
    ("grouped", 2, 512, 4096, 7168, 1040), ("grouped", 2, 512, 7168, 2048, 916),
    ("grouped", 4, 256, 4096, 7168, 932), ("grouped", 4, 256, 7168, 2048, 815),
    ("dense", 1, 64, 2112, 7168, 206), ("dense", 1, 64, 24576, 1536, 289),
    ("dense", 1, 64, 32768, 512, 219), ("dense", 1, 64, 7168, 16384, 336),
    ("dense", 1, 64, 4096, 7168, 287), ("dense", 1, 64, 7168, 2048, 295),
    ("dense", 1, 128, 2112, 7168, 352), ("dense", 1, 128, 24576, 1536, 535),
    ("dense", 1, 128, 32768, 512, 358), ("dense", 1, 128, 7168, 16384, 645),
    ("dense", 1, 128, 4096, 7168, 533), ("dense", 1, 128, 7168, 2048, 510),
    ("dense", 1, 4096, 2112, 7168, 1127), ("dense", 1, 4096, 24576, 1536, 1212),
    ("dense", 1, 4096, 32768, 512, 775), ("dense", 1, 4096, 7168, 16384, 1520),
    ("dense", 1, 4096, 4096, 7168, 1410), ("dense", 1, 4096, 7168, 2048, 1168),
]
H800 = {"fp8": 1979.0, "hbm_tbps": 3.35, "sm": 132}  # datasheet (H800 SXM5 = H100 SXM5 compute)

# nccl-tests / nccl issues (reference/collective_busbw.csv)
H100_RING_AR_BUSBW, H100_NVLINK = 370.0, 450.0
NCCL_SRC_INTRA = "NVIDIA/nccl-tests issue 212 (H100 8-GPU ring all_reduce 370 GB/s busbw of 450 GB/s NVLink)"
NIC_ACHIEVABLE = 48.5 / 50.0
NIC_SRC = "NVIDIA/nccl-tests issue 267 (CX7 NDR400 48-49 GB/s per NIC)"
INTER_AR = {2: 330.0 / (8 * 48.5), 4: 320.0 / (8 * 48.5)}  # fraction of node NIC bw, NVLS off
INTER_SRC = "NVIDIA/nccl issue 1221 (H100 2-node 330, 4-node 320 GB/s all_reduce busbw)"
LAT_SCALEUP_US, LAT_SCALEOUT_US = 10.0, 30.0  # assumed base latencies for the size ramp

# DeepEP / HybridEP (reference/ep_dispatch_combine_bandwidth.csv)
EP_ROWS = {  # backend, scope -> {ep: (dispatch, combine, ref fabric GB/s, source)}
    ("deepep", "scaleup"): {8: (323.0, 326.0, 450.0,
                                "NVIDIA-NeMo/Automodel docs/deepep_vs_hybridep_benchmark.md (H100 EP8, 24 SMs)")},
    ("hybridep", "scaleup"): {8: (358.0, 364.0, 450.0,
                                  "NVIDIA-NeMo/Automodel docs/deepep_vs_hybridep_benchmark.md (H100 EP8, 24 SMs)")},
    # EP16: the H100 measurement of the same library (counted bytes, local node included: see
    # cost_model/constants.py "DeepEP / HybridEP"). The README's H800 EP16 figure (43 GB/s) is not
    # used: under that counting half of an EP16 payload stays on the node, so 43 would mean ~22 GB/s
    # on the NIC, half of what the README's own EP32 / EP64 rows imply (58 x 3/4, 51 x ~7/8 ~ 43).
    ("deepep", "scaleout"): {16: (79.5, 68.2, 50.0,
                                  "NVIDIA-NeMo/Automodel docs/deepep_vs_hybridep_benchmark.md (H100 RDMA EP16, 24 SMs)"),
                             32: (58.0, 57.0, 50.0, "deepseek-ai/DeepEP README @de8cfca (H800 RDMA EP32)"),
                             64: (51.0, 50.0, 50.0, "deepseek-ai/DeepEP README @de8cfca (H800 RDMA EP64)")},
}
# HybridEP vs DeepEP on the same H100 RDMA system (Automodel): 81.6/79.5 dispatch, 76.5/68.2 combine
HYBRID_OVER_DEEPEP_RDMA = (81.6 / 79.5, 76.5 / 68.2)

# Published per-kind measurements (arXiv 2603.07685, "Scalable Training of MoE Models with Megatron
# Core", NVIDIA): read from cost_model/data/ (each row keeps its table and setting in `source`), not
# copied here. A kind listed below takes them in place of the rows scaled from H100 by link or peak
# ratio. Table 7 measures HybridEP and all-to-all on GB200 NVL72 (EP 8-64, all inside the NVLink
# domain); Table 9 names its platform "Blackwell", and GB200 is the paper's Blackwell training
# system (Tables 11, 17). GB300 (Blackwell Ultra, twice the exponential-unit rate) has no row there;
# its attention is anchored to cuDNN's own GB300 benchmark of the same DeepSeek-V3 shape (cudnn-frontend
# sdpa_benchmark_training results, cuDNN 9.22, seq 2048-32768: platform "blackwell-ultra"), and B300, the
# same chip, to that efficiency at its own peak (SAME_CHIP_ATTN). B200 has neither and keeps the derived rows.
DATA_DIR = Path(__file__).resolve().parent / "data"
PUBLISHED_EP_HW = {"gb200-nvl72": "gb200"}         # kind -> `hw` of ep_dispatch_combine_bandwidth.csv
PUBLISHED_ATTN_PLATFORM = {"gb200-nvl72": "blackwell", "gb300-nvl72": "blackwell-ultra"}  # -> attention_sdpa_tflops.csv `platform`
# A kind built on the same chip as a kind with published attention rows takes that kind's measured
# efficiency at its own bf16 peak: HGX B300 is the Blackwell Ultra GPU of GB300 (the attention-relevant
# part, twice Blackwell's exponential-unit rate, is the chip's), power-capped to 2.25 against 2.5 PF
# dense bf16 (clusters/b300.yaml, clusters/gb300-nvl72.yaml datasheets)
SAME_CHIP_ATTN = {"b300": "gb300-nvl72"}
# The setting Table 7 states is hidden 7168, sequence 4096 (tokens per GPU), 256 experts; it does not
# state top-k, routing, dtype or SMs. Assumed: DeepSeek-V3's top-8 with uniform routing (no group
# limit: the dispatch benchmarks draw random scores) and BF16 tokens both ways (no FP8 is stated).
TABLE7_EXPERTS, TABLE7_TOPK, TABLE7_TOKEN_BYTES = 256, 8, (2.0 * 7168, 2.0 * 7168)
# DeepEP is not in Table 7: on a kind with published HybridEP rows its NVLink rows are those x the
# DeepEP/HybridEP ratio of the same H100 NVLink benchmark (EP_ROWS above: 323/358, 326/364).
DEEPEP_OVER_HYBRID_NVLINK = (EP_ROWS[("deepep", "scaleup")][8][0] / EP_ROWS[("hybridep", "scaleup")][8][0],
                             EP_ROWS[("deepep", "scaleup")][8][1] / EP_ROWS[("hybridep", "scaleup")][8][1])


def _data_rows(name: str, **match) -> list[dict]:
    with open(DATA_DIR / name, newline="") as f:
        return [r for r in csv.DictReader(f) if all(r[k] == v for k, v in match.items())]


def published_ep_rows(kind: str) -> list[dict]:
    """`ep_dispatch` scale-up rows of `kind` solved from published per-call times (Table 7), so that
    `TableOps.ep_dispatch` at the table's own setting returns the published microseconds: the rows
    carry the rate at the flex rows' reference token size (`constants` FLEX_REF_TOKEN_BYTES), the
    per-token term of tokens of other sizes taken out. Empty for a kind with no published rows."""
    from types import SimpleNamespace

    from cost_model.blocks import distinct_ranks
    from cost_model.constants import FLEX_PER_TOKEN_S, FLEX_REF_TOKEN_BYTES
    hw = PUBLISHED_EP_HW.get(kind)
    if hw is None:
        return []
    rows = []
    uniform = SimpleNamespace(moe_router_num_groups=0, moe_router_group_topk=0)
    for r in _data_rows("ep_dispatch_combine_bandwidth.csv", hw=hw, kernel="normal"):
        ep, T, h, E = int(r["ep"]), float(r["tokens"]), float(r["hidden"]), TABLE7_EXPERTS
        t_us = (float(r["dispatch_us"]), float(r["combine_us"]))
        src = f"published: {r['source']}; assumed uniform top-8, BF16 tokens; rate solved from the time (build_default_tables)"
        if r["library"] == "hybridep":
            # flex: every counted token (distinct destination ranks) on the NVLink leg
            n_tok = T * float(distinct_ranks(uniform, E, TABLE7_TOPK, np.array([float(ep)]))[0])
            lat = LAT_SCALEUP_US * 2
            gbps = []
            for i in range(2):
                c0 = FLEX_PER_TOKEN_S[("hybridep", "scaleup")][i]
                size = TABLE7_TOKEN_BYTES[i]
                per_tok = n_tok * c0 * (1.0 - size / FLEX_REF_TOKEN_BYTES[i])
                gbps.append(n_tok * size / ((t_us[i] - lat) * 1e-6 - per_tok) / 1e9)
            rows.append(dict(backend="hybridep", scope="scaleup", ep=ep, dispatch_gbps=gbps[0],
                             combine_gbps=gbps[1], latency_us=lat, source=src))
            r_d, r_c = DEEPEP_OVER_HYBRID_NVLINK
            rows.append(dict(backend="deepep", scope="scaleup", ep=ep, dispatch_gbps=gbps[0] * r_d,
                             combine_gbps=gbps[1] * r_c, latency_us=lat,
                             source=f"derived: HybridEP row ({r['source']}) x DeepEP/HybridEP H100 NVLink ratio "
                                    "(NVIDIA-NeMo/Automodel docs/deepep_vs_hybridep_benchmark.md, EP8 24 SMs)"))
        elif r["library"] == "nccl-alltoall":
            # NCCL all-to-all: top-k copies of every token, the (ep - 1)/ep of them not local
            nbytes = 2.0 * h * T * TABLE7_TOPK * (ep - 1) / ep
            lat = LAT_SCALEUP_US
            d, c = (nbytes / ((t - lat) * 1e-6) / 1e9 for t in t_us)
            rows.append(dict(backend="alltoall", scope="scaleup", ep=ep, dispatch_gbps=d, combine_gbps=c,
                             latency_us=lat, source=src))
    return rows


def published_attention(kind: str) -> dict[tuple[str, int], tuple[float, int, str]]:
    """{(direction, seq): (TFLOPS, qk head dim, source row label)} of the published SDPA rows of
    `kind` ("published: ..."); for a kind in SAME_CHIP_ATTN, its sibling's rows x the two kinds'
    bf16 peak ratio ("derived: ...")."""
    if kind in SAME_CHIP_ATTN:
        sib = SAME_CHIP_ATTN[kind]
        ratio = _spec_for(kind)["bf16"] / _spec_for(sib)["bf16"]
        return {key: (v * ratio, hd, f"derived: {sib} x {ratio:.3f} (bf16 peak ratio, same chip): "
                                     f"{src.removeprefix('published: ')}")
                for key, (v, hd, src) in published_attention(sib).items()}
    plat = PUBLISHED_ATTN_PLATFORM.get(kind)
    if plat is None:
        return {}
    out = {}
    for r in _data_rows("attention_sdpa_tflops.csv", platform=plat, dtype="bf16"):
        for direction in ("fwd", "bwd"):
            out[(direction, int(r["seq"]))] = (float(r[f"{direction}_tflops"]), int(r["head_dim_qk"]),
                                               f"published: {r['source']}")
    return out


def attention_anchor(pub: dict, direction: str, seq: float, derived_at) -> float:
    """Factor taking the derived FlashAttention curve through the published points of `direction`:
    published / derived at each published sequence length, interpolated in log sequence length
    between them and held beyond them (the curve's shape outside the measured range)."""
    pts = sorted((s, v[0] / derived_at(direction, s, v[1])) for (d, s), v in pub.items() if d == direction)
    if not pts:
        return 1.0
    xs = np.log([p[0] for p in pts])
    return float(np.interp(math.log(seq), xs, [p[1] for p in pts]))


M_AX = [16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
NK_AX = [64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
G_AX = [1, 2, 4, 8, 16, 32, 64, 128, 256]
GROUP_AX = [2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
PERNODE_AX = [1, 2, 4, 8, 16, 36, 72]
BYTES_AX = [2.0 ** i for i in range(10, 35, 2)]


# --- GEMM model -------------------------------------------------------------------------------
def _tile_eff(groups, m, n, sm):
    """Best output-tile choice (as DeepGEMM/cuBLAS heuristics pick): padding x wave quantisation."""
    m, n, groups = np.asarray(m, float), np.asarray(n, float), np.asarray(groups, float)
    best = None
    for bm, bn in ((64, 64), (64, 128), (128, 128), (128, 256)):
        tiles_m, tiles_n = np.ceil(m / bm), np.ceil(n / bn)
        tiles = groups * tiles_m * tiles_n
        pad = (m * n) / (tiles_m * bm * tiles_n * bn)
        eff = pad * tiles / (np.ceil(tiles / sm) * sm)
        best = eff if best is None else np.maximum(best, eff)
    return best


def gemm_tflops(groups, m, n, k, *, peak, hbm_tbps, sm, elem_bytes, params):
    e_c, e_m, p = params
    groups, m, n, k = (np.asarray(x, float) for x in (groups, m, n, k))
    flops = 2.0 * groups * m * n * k
    byts = groups * (elem_bytes * (m * k + k * n) + 2.0 * m * n)
    tc = flops / (peak * 1e12 * e_c * _tile_eff(groups, m, n, sm))
    tm = byts / (hbm_tbps * 1e12 * e_m)
    t = (tc ** p + tm ** p) ** (1.0 / p)
    return flops / t / 1e12


def fit_gemm() -> tuple[np.ndarray, float]:
    rows = np.array([r[1:] for r in DEEPGEMM], float)

    def resid(x):
        e_c, e_m, p = x
        pred = gemm_tflops(rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 3], peak=H800["fp8"],
                           hbm_tbps=H800["hbm_tbps"], sm=H800["sm"], elem_bytes=1.0, params=(e_c, e_m, p))
        return np.log(pred) - np.log(rows[:, 4])

    sol = least_squares(resid, x0=[0.75, 0.7, 2.0], bounds=([0.1, 0.1, 1.0], [1.0, 1.0, 8.0]))
    return sol.x, float(np.sqrt(np.mean(sol.fun ** 2)))


# --- attention --------------------------------------------------------------------------------
FA_FWD_FRACTION = {512: 0.33, 1024: 0.45, 2048: 0.53, 4096: 0.58, 8192: 0.61, 16384: 0.63,
                   32768: 0.64, 65536: 0.64, 131072: 0.64}
FA_BWD_OVER_FWD = 0.80
FA_HEADDIM = {64: 0.70, 128: 1.00, 192: 1.02, 256: 1.05}
FA_SRC = ("approx. FlashAttention-3 (arXiv:2407.08608) H100 bf16 causal fraction of peak; "
          "bwd = 0.8 x fwd; head-dim factors approximate; scaled by bf16 peak")
# bh (batch x heads of one call): one constant value, so the axis is inert in these tables. The
# FA3 reading has no bh dependence to encode (its benchmark holds 16k tokens per call and varies
# batch with seq); 32 is the heads per call of a GPU `moetune profile` by default
# (trials/profile/attention.py GPU_HEADS), so a shipped and a measured GPU table carry the same bh.
FA_BH = 32


# A kind with no scale-out network (cpu-local: one host) still gets finite scale-out rows, so a
# plan that would cross hosts is priced rather than divided by zero: a 10 Gb/s placeholder.
NO_NETWORK_PLACEHOLDER_GBIT = 10.0


def _spec_for(kind: str) -> dict:
    """Hardware numbers from the cluster catalog (clusters/<kind>.yaml), the one place they live,
    or from a cluster YAML file (a kind of its own)."""
    from clusters import load_cluster
    c = load_cluster(kind)
    is_file = kind.endswith((".yaml", ".yml"))
    pk = c.peak_tflops
    return dict(bf16=float(pk.get("bf16") or pk.get("fp16") or pk.get("fp32")),
                fp8=float(pk.get("fp8") or 0.0), hbm_tbps=float(c.hbm_tbps), sm=int(c.sm_count),
                nvlink=float(c.nvlink_gbps), nic_gbit=float(c.scaleout_gbps or NO_NETWORK_PLACEHOLDER_GBIT), pcie=float(c.pcie_gbps),
                name=c.kind, src_kind=kind if is_file else f"clusters/{kind}.yaml")


# bf16 tensor-core efficiency e_c, from measured maximum achievable matmul FLOPS (MAMF, mamf-finder.py
# scanning large shapes; stas00/ml-engineering). Hopper: e_c is solved so this GEMM model reproduces
# the H100 SXM row of compute/accelerator/README.md "Maximum Achievable Matmul FLOPS comparison
# table": 792.1 TFLOPS (80.1% of 989) at its best shape 6144x17920x2816, CUDA 12.1 (H100_MAMF).
# Blackwell: no shape is published, so the Hopper e_c is scaled by the ratio of the two families'
# MAMF efficiencies measured with the same tool and protocol (compute/accelerator/benchmarks/
# README.md "What we measured: alone vs all-8 concurrent", all 8 GPUs busy: H200 823.9 / 989.4,
# B200 1751.2 / 2250). Other kinds (A100, H20, RTX 4090, cpu-local) take the Hopper e_c (an
# extrapolation, as the DeepGEMM fit is). The earlier build solved e_c = 0.8824 from one Megatron
# bf16 layer timing: above this measured ceiling. The same benchmarks README also gives the
# power-saturated sustained rate (MSMF, H200 698.6, B200 1426.4); it is NOT used: the held-out
# Megatron bf16 layer timings on H100 run faster than MSMF allows (mixtral_a2a_bf16 forward does
# 2.89 TFLOP of expert GEMM in 4.33 ms including its all-to-alls; at 698.6 TFLOPS the GEMMs alone
# take 4.13 ms). fp8 keeps the DeepGEMM H800 fit (e_c 0.715 of 1979), consistent with the benchmarks
# README's H200 fp8 MAMF of 1453.4 (73.4%).
MAMF_SRC = "stas00/ml-engineering compute/accelerator README.md + benchmarks/README.md (mamf-finder MAMF)"
H100_MAMF = (6144, 17920, 2816, 792.1)  # m, n, k, TFLOPS (H100 SXM, CUDA 12.1)
MAMF_EFFICIENCY = {"hopper": 823.9 / 989.4, "blackwell": 1751.2 / 2250.0}  # all 8 GPUs busy, cu130
BLACKWELL_KINDS = ("b200", "b300", "gb200-nvl72", "gb300-nvl72")


def bf16_efficiency(kind: str, params) -> tuple[float, str]:
    """(bf16 e_c, family): Hopper solved on the H100 MAMF row; Blackwell scaled by the MAMF ratio."""
    from scipy.optimize import brentq
    h = _spec_for("h100-sxm")
    m, n, k, tf = H100_MAMF
    ec = brentq(lambda e: gemm_tflops(1, m, n, k, peak=h["bf16"], hbm_tbps=h["hbm_tbps"], sm=h["sm"],
                                      elem_bytes=2.0, params=(e, params[1], params[2])) - tf, 0.3, 1.0)
    fam = "blackwell" if kind in BLACKWELL_KINDS else "hopper"
    return float(ec * MAMF_EFFICIENCY[fam] / MAMF_EFFICIENCY["hopper"]), fam


def build(kind: str, out_root: Path, params, rms) -> str:
    """Write the tables of `kind` (a catalog name or a cluster YAML file) under out_root/<its kind>."""
    s = _spec_for(kind)
    src_hw = s["src_kind"]
    kind = s["name"]
    out = out_root / kind
    out.mkdir(parents=True, exist_ok=True)
    notes = [f"hardware values from {src_hw}",
             f"GEMM model fitted on DeepGEMM H800 FP8 rows: e_c={params[0]:.4f} e_m={params[1]:.4f} "
             f"p={params[2]:.3f}, log-RMS error {rms:.3f}; applied to bf16 and to this GPU by peak/HBM/SM "
             "ratio (extrapolation)",
             f"grid ranges m {M_AX[0]}..{M_AX[-1]}, n/k {NK_AX[0]}..{NK_AX[-1]}; queries clamp outside",
             f"collective size ramp uses assumed base latency {LAT_SCALEUP_US} us scale-up, "
             f"{LAT_SCALEOUT_US} us scale-out (no public small-message rows in the reference set)",
             "dispatch_gap (GPU kinds: a public lower bound) and membw (assumed) are not measurements of this host; "
             "`moetune profile` replaces them"]
    ec_bf16, fam = bf16_efficiency(kind, params)
    notes.append(f"bf16 GEMM compute efficiency e_c={ec_bf16:.4f} from measured MAMF ({fam} family, "
                 f"{MAMF_SRC}); e_m and p as the fp8 fit")
    dtypes = {"bf16": (s["bf16"], 2.0, (ec_bf16, params[1], params[2]))}
    if s["fp8"] > 0:
        dtypes["fp8"] = (s["fp8"], 1.0, tuple(params))
    gsrc = "derived:gemm-roofline-fit(deepgemm-h800-fp8)+hw"
    sources = {gsrc: f"tiled-roofline fit to {DEEPGEMM_SRC}; bf16 efficiency from {MAMF_SRC}; "
                     f"peak/HBM/SM of {src_hw}"}
    # gemm
    rows = []
    for dt, (peak, eb, prm) in dtypes.items():
        M, N, K = np.meshgrid(M_AX, NK_AX, NK_AX, indexing="ij")
        tf = gemm_tflops(1, M, N, K, peak=peak, hbm_tbps=s["hbm_tbps"], sm=s["sm"], elem_bytes=eb, params=prm)
        for m, n, k, v in zip(M.ravel(), N.ravel(), K.ravel(), tf.ravel()):
            rows.append(dict(dtype=dt, m=int(m), n=int(n), k=int(k), tflops=float(v), source=gsrc))
    write_family(out, "gemm", rows)
    # grouped gemm
    rows = []
    for dt, (peak, eb, prm) in dtypes.items():
        G, M, N, K = np.meshgrid(G_AX, M_AX, NK_AX[2:-2], NK_AX[2:-2], indexing="ij")
        tf = gemm_tflops(G, M, N, K, peak=peak, hbm_tbps=s["hbm_tbps"], sm=s["sm"], elem_bytes=eb, params=prm)
        for g, m, n, k, v in zip(G.ravel(), M.ravel(), N.ravel(), K.ravel(), tf.ravel()):
            rows.append(dict(dtype=dt, groups=int(g), m=int(m), n=int(n), k=int(k), tflops=float(v), source=gsrc))
    write_family(out, "grouped_gemm", rows)
    # attention (always bf16 in Megatron unless fp8 DPA is enabled)
    def fa_tflops(direction, seq, hd):
        return s["bf16"] * FA_FWD_FRACTION[seq] * FA_HEADDIM[hd] * (FA_BWD_OVER_FWD if direction == "bwd" else 1.0)
    pub = published_attention(kind)
    tag = "derived:fa3-fraction+hw" if not pub else "derived:fa3-fraction+hw, anchored to published SDPA rows"
    rows = []
    for direction in ("fwd", "bwd"):
        for seq in FA_FWD_FRACTION:
            k = attention_anchor(pub, direction, seq, fa_tflops)
            for hd in FA_HEADDIM:
                hit = pub.get((direction, seq))
                if hit is not None and hit[1] == hd:  # the published row itself
                    rows.append(dict(dtype="bf16", direction=direction, seq=seq, head_dim=hd, bh=FA_BH,
                                     tflops=hit[0], source=hit[2]))
                    continue
                rows.append(dict(dtype="bf16", direction=direction, seq=seq, head_dim=hd, bh=FA_BH,
                                 tflops=fa_tflops(direction, seq, hd) * k, source=tag))
    sources[tag] = f"{FA_SRC}; bf16 peak of {src_hw}; one bh value ({FA_BH}): no batch x heads dependence"
    if pub:
        sources[tag] += ("; x published / derived at the published rows (cost_model/data/attention_sdpa_tflops.csv), "
                         "interpolated in log sequence length and held outside them")
    write_family(out, "attention", rows)
    # collectives
    scaleup_link = s["nvlink"] if s["nvlink"] > 0 else s.get("pcie", 0.0) or 10.0
    up_peak = scaleup_link * H100_RING_AR_BUSBW / H100_NVLINK
    nic = s["nic_gbit"] / 8.0 * NIC_ACHIEVABLE
    # node-count factor: fitted power law through the 2- and 4-node rows
    slope = math.log(INTER_AR[4] / INTER_AR[2]) / math.log(2.0)
    rows = []
    for coll in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "send_recv"):
        for g in GROUP_AX:
            for b in BYTES_AX:
                if g <= 72:
                    peak = up_peak
                    bw = peak * b / (b + peak * 1e9 * LAT_SCALEUP_US * 1e-6)
                    rows.append(dict(collective=coll, scope="scaleup", group=g, per_node=g, bytes=b,
                                     busbw_gbps=bw, source="derived:nccl-h100-intra+hw"))
                for pn in PERNODE_AX:
                    if pn >= g:
                        continue
                    nodes = max(2.0, g / pn)
                    f = INTER_AR[2] * (nodes / 2.0) ** slope
                    peak = min(up_peak, pn * nic * f) if coll != "send_recv" else nic
                    lat = LAT_SCALEOUT_US * (1.0 + math.log2(nodes) / 4.0)
                    bw = peak * b / (b + peak * 1e9 * lat * 1e-6)
                    rows.append(dict(collective=coll, scope="scaleout", group=g, per_node=pn, bytes=b,
                                     busbw_gbps=bw, source="derived:nccl-h100-inter+hw"))
    sources["derived:nccl-h100-intra+hw"] = (f"{NCCL_SRC_INTRA}; scaled by scale-up link of {src_hw}; "
                                             f"ramp latency {LAT_SCALEUP_US} us (assumed)")
    sources["derived:nccl-h100-inter+hw"] = (f"{INTER_SRC}; {NIC_SRC}; NIC of {src_hw}; node-count power law "
                                             f"fitted to 2/4-node rows, extrapolated beyond 4 nodes; ramp latency "
                                             f"{LAT_SCALEOUT_US} us x (1 + log2(nodes)/4) (assumed)")
    write_family(out, "collectives", rows)
    # EP dispatch
    rows = published_ep_rows(kind)  # scale-up rows of the backends published for this kind (GridTable clamps past them)
    published = {r["backend"] for r in rows}
    for ep in (2, 4, 8, 16, 32, 64, 128, 256, 512):
        for backend in ("deepep", "hybridep"):
            d0, c0, ref, src = EP_ROWS[(backend, "scaleup")][8]
            r = scaleup_link / ref
            if backend not in published:
                rows.append(dict(backend=backend, scope="scaleup", ep=ep, dispatch_gbps=d0 * r, combine_gbps=c0 * r,
                                 latency_us=LAT_SCALEUP_US * 2, source=f"derived: {src} x NVLink ratio ({src_hw})"))
            sel = min(EP_ROWS[("deepep", "scaleout")], key=lambda e: abs(math.log2(e) - math.log2(max(ep, 16))))
            d0, c0, ref, src = EP_ROWS[("deepep", "scaleout")][sel]
            r = (s["nic_gbit"] / 8.0) / ref
            if backend == "hybridep":
                d0, c0 = d0 * HYBRID_OVER_DEEPEP_RDMA[0], c0 * HYBRID_OVER_DEEPEP_RDMA[1]
                src += "; x HybridEP/DeepEP RDMA ratio (NeMo Automodel H100 EP16)"
            rows.append(dict(backend=backend, scope="scaleout", ep=ep, dispatch_gbps=d0 * r, combine_gbps=c0 * r,
                             latency_us=LAT_SCALEOUT_US * 2, source=f"derived: {src} x NIC ratio ({src_hw})"))
        a2a_up = up_peak
        a2a_out = nic * INTER_AR[2] * (max(2.0, ep / 8.0) / 2.0) ** slope
        if "alltoall" not in published:
            rows.append(dict(backend="alltoall", scope="scaleup", ep=ep, dispatch_gbps=a2a_up, combine_gbps=a2a_up,
                             latency_us=LAT_SCALEUP_US, source=f"derived: NCCL all_to_all = {NCCL_SRC_INTRA}"))
        rows.append(dict(backend="alltoall", scope="scaleout", ep=ep, dispatch_gbps=a2a_out, combine_gbps=a2a_out,
                         latency_us=LAT_SCALEOUT_US, source=f"derived: NCCL all_to_all per-GPU NIC; {NIC_SRC}; {INTER_SRC}"))
    write_family(out, "ep_dispatch", rows)
    if kind == "cpu-local":
        gap, gap_src = 20.0, "assumed: PyTorch eager per-kernel CPU enqueue stall (no public row in reference set)"
    elif kind in GRACE_HOST_KINDS:
        gap, gap_src = HOST_US_PER_LAUNCH * GRACE_OVER_X86_HOST, GRACE_HOST_SRC
    else:
        gap, gap_src = HOST_US_PER_LAUNCH, HOST_US_PER_LAUNCH_SRC
    write_family(out, "dispatch_gap", [dict(mode="eager", gap_us=round(gap, 2), source=gap_src)])
    hbm = s["hbm_tbps"] * 1000.0
    fr = {"elementwise": 0.80, "permute": 0.55, "router": 0.40, "cross_entropy": 0.60, "optimizer": 0.75}
    write_family(out, "membw", [dict(op=o, gbps=hbm * f, source=f"assumed: {f:.2f} x HBM {hbm:.0f} GB/s ({src_hw})")
                                for o, f in fr.items()])
    return write_meta(out, kind, "cost_model/build_default_tables.py", notes, sources)


# Host seconds per launched kernel of a PyTorch-eager training step (GPU kinds): DeepSeek's public
# training trace (github.com/deepseek-ai/profile-data train.json, PyTorch profiler, H800, one DualPipe
# forward+backward chunk pair of 4 MoE layers; `python bench/trace_host_idle.py train.json`) spends
# 21.9 us of host wall time per launched kernel in its leanest compute phase (attn(W): weight-gradient
# GEMM launches and little Python), 26-51 us in the others, 44.9 us kernel-weighted over the compute
# phases. The leanest phase is taken: a lower bound for a Megatron / TransformerEngine step, whose
# modules run more Python per kernel; the profiler's own per-op cost (no-op aten calls take 0-3 us in
# that trace) is inside it. A host property (CPU, Python, PyTorch), measured on one host and used
# for every GPU kind; `moetune profile` measures the target's own. (The figure lives in
# cost_model.constants, where the cost model also counts host work in these launches.)
HOST_US_PER_LAUNCH_SRC = ("derived: deepseek-ai/profile-data train.json (PyTorch profiler, H800 host): 21.9 us host per launched "
                          "kernel in the leanest compute phase (26-51 in the others); a lower bound "
                          "(bench/trace_host_idle.py, cost_model/build_default_tables.py HOST_US_PER_LAUNCH)")
# Grace hosts: the GB200 / GB300 NVL72 compute trays drive their Blackwell GPUs from Grace (Arm) CPUs,
# which issue each PyTorch op ~2.75x slower than an x86 DGX host: NVIDIA/TransformerEngine issue 2053
# (2025-08, "High CPU overhead on Grace systems") times the host side of one torch.nn.Linear forward
# (bf16, hidden 2048, 8,192 tokens) at 37.08 us on GB200 against 13.48 us on an H100 DGX (Xeon
# Platinum 8480C), 33.17 on GH200 (2.46x); TE's own Linear shows the same order (99.66 us on GB200).
# The x86 per-launch figure above scales by the GB200 ratio (the same op on both hosts).
GRACE_HOST_KINDS = ("gb200-nvl72", "gb300-nvl72")
GRACE_OVER_X86_HOST = 37.08 / 13.48
GRACE_HOST_SRC = (f"derived: {HOST_US_PER_LAUNCH:g} us per launch on an x86 host (deepseek-ai/profile-data train.json, "
                  f"a lower bound) x {GRACE_OVER_X86_HOST:.3f}, a Grace host's per-op time over an x86 DGX's "
                  "(NVIDIA/TransformerEngine issue 2053: torch.nn.Linear forward host time 37.08 us on GB200 vs 13.48 "
                  "on H100 DGX; cost_model/build_default_tables.py GRACE_OVER_X86_HOST)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    from clusters import kind_names
    ap.add_argument("--kinds", default=",".join(kind_names()))
    ap.add_argument("--out", default=str(TABLE_ROOT))
    a = ap.parse_args(argv)
    params, rms = fit_gemm()
    print(f"GEMM fit: e_c={params[0]:.4f} e_m={params[1]:.4f} p={params[2]:.3f} log-RMS={rms:.3f}")
    for kind in ("h100-sxm", BLACKWELL_KINDS[0]):
        ec, fam = bf16_efficiency(kind, params)
        print(f"{fam}: bf16 e_c={ec:.4f} (from measured MAMF)")
    for kind in a.kinds.split(","):
        d = build(kind, Path(a.out), params, rms)
        print(f"{kind}: {d[:16]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
