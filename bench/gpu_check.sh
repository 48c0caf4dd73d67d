#!/usr/bin/env bash
# bench/gpu_check.sh: what only a GPU can check, in one prepared run (about 6-8 minutes on one
# H200). Every step runs under `timeout` and writes under the output folder; a step that cannot
# run here prints "SKIP <step>: <reason>". Always exits 0; the verdicts are in summary.txt.
#
#   bash bench/gpu_check.sh [OUT_DIR]        (default: $OUT, else ./gpu_check_out)
#
# Through the device tool: run(command="bash bench/gpu_check.sh $OUT", carry=["bench/.gpu_site"]),
# after `bash bench/make_gpu_site.sh` here (megatron-core and pure-Python deps for a bare torch
# environment; never `pip install .` there, which pins torch 2.13). See bench/README.md.
#
# Steps (what each proves: bench/README.md)
#   0 environment        driver, GPU, torch / CUDA / NCCL, TE if importable, optional libraries
#   1 tiny-moe trials    one-rank NCCL Megatron-core trials: distributed and plain optimizer, and
#                        plans this stack cannot build (gg=1; fp8 without TE) -> unrealizable
#   2 olmoe2 trial       2-layer OLMoE-1B-7B cut at seq 2048: measured step time and memory
#                        (compared with predictions afterwards, on CPU: bench/gpu_check_compare.py)
#   3 profile            a 2.5-minute `moetune profile` sweep -> OUT/tables
#   4 timing probe       bench/gpu_timing_probe.py: the size of each timing bias, and the cost of a
#                        tiny kernel inside a replayed CUDA graph (the serving kernel minimum)
#   5 sglang serving     one-GPU `moetune serve-trial --backend sglang` of the tiny MoE (skips
#                        without CUDA or without SGLang's CUDA kernels)
#   6 kernels            the Triton kernels of kernels/ against torch references, a block-config
#                        sweep and a (c, K) grid
#   7 sm share           bench/sm_share_probe.py, run right after step 0: a 20-program copy grid
#                        beside cuBLAS GEMMs (high / normal priority, cooperative): its rate beside them
# Environment knobs: PYTHON (interpreter), GPU_CHECK_TOTAL_S (whole-run limit, default 570 s,
# under the device tool's 600 s per command), GPU_CHECK_PROFILE_MIN (step 3 budget, default 2.5).
set -u
cd "$(dirname "$0")/.."
REPO=$PWD
OUTDIR=${1:-${OUT:-gpu_check_out}}
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
SUMMARY=$OUTDIR/summary.txt
: > "$SUMMARY"
PY=${PYTHON:-python}
TOTAL_S=${GPU_CHECK_TOTAL_S:-570}
PROFILE_MIN=${GPU_CHECK_PROFILE_MIN:-2.5}
START=$(date +%s)
SITE=$REPO/bench/.gpu_site
export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
[ -d "$SITE" ] && export PYTHONPATH=$PYTHONPATH:$SITE
export MOETUNE_HOME=$OUTDIR/moetune_home  # measured tables / calibrations stay inside OUT
export PYTHONWARNINGS=ignore
TMPSITE=""
trap '[ -n "$TMPSITE" ] && rm -rf "$TMPSITE"' EXIT

say() { echo "$*" | tee -a "$SUMMARY"; }
elapsed() { echo $(( $(date +%s) - START )); }
# step_limit WANT: seconds a step may take, or 0 when the whole-run limit leaves under 20 s
step_limit() { local left=$(( TOTAL_S - $(elapsed) )); [ "$left" -lt 20 ] && { echo 0; return; }
               [ "$1" -lt "$left" ] && echo "$1" || echo "$left"; }
# run_cmd NAME LIMIT CMD...: run under timeout, output to OUT/NAME.log; prints the exit code
run_cmd() { local name=$1 limit=$2; shift 2
            timeout --kill-after=10 "$limit" "$@" > "$OUTDIR/$name.log" 2>&1; echo $?; }
# run_json NAME LIMIT CMD...: the same, stdout (a --json result) to OUT/NAME.json, stderr to OUT/NAME.log
run_json() { local name=$1 limit=$2; shift 2
             timeout --kill-after=10 "$limit" "$@" > "$OUTDIR/$name.json" 2> "$OUTDIR/$name.log"; echo $?; }

# ---- step 0: environment ----------------------------------------------------------------------
say "gpu_check $(date -u +%FT%TZ) repo $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?') out $OUTDIR"
if command -v nvidia-smi >/dev/null 2>&1; then
  timeout 20 nvidia-smi > "$OUTDIR/nvidia-smi.txt" 2>&1
  timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit \
    --format=csv > "$OUTDIR/nvidia-smi-query.csv" 2>&1
else
  echo "nvidia-smi not found" > "$OUTDIR/nvidia-smi.txt"
fi
if ! timeout 60 "$PY" -c "import numpy" >/dev/null 2>&1; then
  WHL=$(ls "$SITE"/wheels/numpy-*.whl 2>/dev/null | head -1)
  if [ -n "$WHL" ]; then  # the GPU machine's Python lacks numpy: unpack the shipped wheel (not into OUT)
    TMPSITE=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check_site.XXXXXX")
    "$PY" -m zipfile -e "$WHL" "$TMPSITE" && export PYTHONPATH=$PYTHONPATH:$TMPSITE
  fi
fi
rc0=$(run_cmd step0_env 90 "$PY" - "$OUTDIR/env.json" <<'PY'
import importlib, importlib.util, json, platform, subprocess, sys
env = {"python": platform.python_version(), "executable": sys.executable}
try:
    import torch
    env.update(torch=torch.__version__, cuda_build=torch.version.cuda, cuda_available=torch.cuda.is_available(),
               has_scaled_mm=hasattr(torch, "_scaled_mm"), has_grouped_mm=hasattr(torch, "_grouped_mm"),
               has_float8=hasattr(torch, "float8_e4m3fn"))
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(device_count=torch.cuda.device_count(), gpu=p.name, capability=f"{p.major}.{p.minor}",
                   memory_gib=round(p.total_memory / 2**30, 1), sms=p.multi_processor_count,
                   l2_mib=round(getattr(p, "L2_cache_size", 0) / 2**20, 1),
                   nccl=".".join(map(str, torch.cuda.nccl.version())))
except Exception as e:  # noqa: BLE001 - the environment report must always be written
    env["torch_error"] = f"{type(e).__name__}: {e}"
mods = {}
# imported: what must load to be usable (TE's ABI against this torch); located only (find_spec):
# the heavy or optional rest, so the environment step stays fast
IMPORT = ("numpy", "yaml", "transformer_engine.pytorch")
for m in ("numpy", "yaml", "tqdm", "packaging", "megatron.core", "transformer_engine.pytorch", "grouped_gemm",
          "deep_ep", "apex", "ray", "optuna", "triton"):
    try:
        if m in IMPORT:
            mod = importlib.import_module(m)
            mods[m] = str(getattr(mod, "__version__", "present"))
        else:
            spec = importlib.util.find_spec(m)
            mods[m] = f"present ({spec.origin})" if spec else "absent (not found)"
    except Exception as e:  # noqa: BLE001
        mods[m] = f"absent ({type(e).__name__})"
env["modules"] = mods
try:
    env["gcc"] = subprocess.run(["gcc", "--version"], capture_output=True, text=True, timeout=10).stdout.splitlines()[0]
except Exception:  # noqa: BLE001
    env["gcc"] = "absent"
json.dump(env, open(sys.argv[1], "w"), indent=1)
print(json.dumps(env, indent=1))
PY
)
say "RAN step0 environment: rc=$rc0 (env.json, nvidia-smi.txt)"
envget() { timeout 30 "$PY" -c "import json,sys; e=json.load(open('$OUTDIR/env.json')); print(eval(sys.argv[1], {}, e))" "$1" 2>/dev/null; }
[ "$(envget "cuda_available")" = "True" ] && HAVE_CUDA=1 || HAVE_CUDA=0
NO_CUDA="no CUDA device visible to torch ($(envget "gpu" 2>/dev/null | grep -v None || echo "torch.cuda.is_available() is False"))"
case "$(envget "modules['megatron.core']")" in absent*|"") HAVE_MEG=0 ;; *) HAVE_MEG=1 ;; esac
case "$(envget "modules['transformer_engine.pytorch']")" in absent*|"") HAVE_TE=0 ;; *) HAVE_TE=1 ;; esac
NO_MEG="megatron-core not importable (build bench/.gpu_site with bench/make_gpu_site.sh and carry it)"
say "       cuda=$HAVE_CUDA megatron=$HAVE_MEG te=$HAVE_TE gpu=$(envget gpu) torch=$(envget torch) nccl=$(envget nccl)"

TRIAL=("$PY" -m tuner.cli trial --cluster h200-sxm --gpus 1 --stack gpu-plain --json)

# ---- step 7 (run first: short, and it measures what issue 22's search depends on most): who gets
#      the SMs when a 20-program copy grid runs beside cuBLAS GEMMs, on a high- or normal-priority
#      stream or launched cooperatively (bench/sm_share_probe.py)
if [ "$HAVE_CUDA" != 1 ]; then say "SKIP step7: $NO_CUDA"
else
  lim=$(step_limit 90)
  if [ "$lim" -lt 30 ]; then say "SKIP step7: whole-run limit ${TOTAL_S}s leaves ${lim}s"; else
    rc=$(run_cmd step7_sm_share "$lim" "$PY" bench/sm_share_probe.py --out "$OUTDIR/sm_share.json" --max-s $((lim - 20)))
    say "RAN step7 sm share: rc=$rc (sm_share.json) $(tail -1 "$OUTDIR/step7_sm_share.log" 2>/dev/null)"
  fi
fi

# ---- step 1: tiny-moe, one rank, NCCL ----------------------------------------------------------
if [ "$HAVE_CUDA" != 1 ]; then say "SKIP step1: $NO_CUDA"
elif [ "$HAVE_MEG" != 1 ]; then say "SKIP step1: $NO_MEG"
else
  # name | plan | expected kind ("ok" = a measurement). gpu-plain is the stack without TE (what
  # this machine has, TE or not): grouped GEMM and fp8 are plans it cannot build
  for spec in "distopt|gg=0|ok" "plainopt|gg=0,do=0,ogr=0,opg=0|ok" "gg1|gg=1|unrealizable" \
              "fp8|gg=0,precision=fp8-delayed|unrealizable"; do
    IFS='|' read -r name plan expect <<< "$spec"
    lim=$(step_limit 150)
    if [ "$lim" = 0 ]; then say "SKIP step1 $name: whole-run limit ${TOTAL_S}s reached"; continue; fi
    rc=$(run_json "step1_$name" "$lim" "${TRIAL[@]}" --model tiny-moe --gbs 8 --seq 256 --plan "$plan" \
         --iters 5 --warmup 2 --timeout $((lim - 15)))
    got=$("$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); print('ok' if d.get('ok') else d.get('kind'))" \
          "$OUTDIR/step1_$name.json" 2>/dev/null || echo "no-json")
    verdict=FAIL; [ "$got" = "$expect" ] && verdict=PASS
    say "RAN step1 $name ($plan): rc=$rc kind=$got expected=$expect $verdict"
  done
fi

# ---- step 2: 2-layer OLMoE-1B-7B cut at seq 2048 ------------------------------------------------
if [ "$HAVE_CUDA" != 1 ]; then say "SKIP step2: $NO_CUDA"
elif [ "$HAVE_MEG" != 1 ]; then say "SKIP step2: $NO_MEG"
else
  lim=$(step_limit 200)
  if [ "$lim" = 0 ]; then say "SKIP step2: whole-run limit ${TOTAL_S}s reached"; else
    rc=$(run_json step2_olmoe2 "$lim" "${TRIAL[@]}" --model bench/gpu_check_olmoe2.yaml --gbs 8 --seq 2048 \
         --plan gg=0 --iters 5 --warmup 2 --timeout $((lim - 15)))
    # the workload goes into the result, for bench/gpu_check_compare.py
    "$PY" - "$OUTDIR/step2_olmoe2.json" <<'PY' >> "$OUTDIR/step2_olmoe2.log" 2>&1
import json, sys
d = json.load(open(sys.argv[1]))
d["workload"] = dict(model="bench/gpu_check_olmoe2.yaml", cluster="h200-sxm", gpus=1, gbs=8, seq=2048,
                     stack="gpu-plain", plan="gg=0")
json.dump(d, open(sys.argv[1], "w"), indent=1)
PY
    res=$("$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); print(f\"step {d['step_time_s']:.4f} s, peak {max(d['peak_memory_gib']):.2f} GiB\" if d.get('ok') else d.get('kind'))" \
          "$OUTDIR/step2_olmoe2.json" 2>/dev/null || echo "no-json")
    say "RAN step2 olmoe2 (gbs 8, seq 2048, gg=0): rc=$rc $res"
  fi
fi

# ---- step 3: profile sweep ----------------------------------------------------------------------
if [ "$HAVE_CUDA" != 1 ]; then say "SKIP step3: $NO_CUDA"
else
  lim=$(step_limit $(( ${PROFILE_MIN%.*} * 60 + 90 )))
  if [ "$lim" -lt 60 ]; then say "SKIP step3: whole-run limit ${TOTAL_S}s leaves ${lim}s"; else
    rc=$(run_cmd step3_profile "$lim" "$PY" -m tuner.cli profile --cluster h200-sxm --sweep full --executor local \
         --budget-min "$PROFILE_MIN" --no-progress --out "$OUTDIR/tables")
    res=$("$PY" -c "import json,sys; m=json.load(open(sys.argv[1])); r=m['profile']['report']; print('measured', ','.join(r['measured']), '| not', ','.join(r['not_measured']))" \
          "$OUTDIR/tables/meta.json" 2>/dev/null || echo "no tables")
    say "RAN step3 profile (${PROFILE_MIN} min): rc=$rc $res"
  fi
fi

# ---- step 4: timing probe -----------------------------------------------------------------------
if [ "$HAVE_CUDA" != 1 ]; then say "SKIP step4: $NO_CUDA"
else
  lim=$(step_limit 120)
  if [ "$lim" -lt 30 ]; then say "SKIP step4: whole-run limit ${TOTAL_S}s leaves ${lim}s"; else
    rc=$(run_cmd step4_probe "$lim" "$PY" bench/gpu_timing_probe.py --out "$OUTDIR/probe.json" \
         --max-s $((lim - 10)))
    say "RAN step4 timing probe: rc=$rc (probe.json) $(tail -1 "$OUTDIR/step4_probe.log" 2>/dev/null)"
  fi
fi

# ---- step 5: one-GPU SGLang serving trial ------------------------------------------------------
# trials/serving/sglang_backend.py for real: launch_server on the tiny MoE (dummy weights), health,
# bench_serving 16 x 128/32 at concurrency 16, parsed; the server's process group reaped.
if [ "$HAVE_CUDA" != 1 ]; then say "SKIP step5: $NO_CUDA"
elif ! timeout 120 "$PY" -c "import sglang.launch_server, sgl_kernel" >/dev/null 2>&1; then
  say "SKIP step5: SGLang with its CUDA kernels (sglang, sgl_kernel) is not importable here"
else
  lim=$(step_limit 240)
  if [ "$lim" -lt 90 ]; then say "SKIP step5: whole-run limit ${TOTAL_S}s leaves ${lim}s"; else
    rc=$(run_json step5_sglang "$lim" "$PY" -m tuner.cli serve-trial --backend sglang --model tiny-moe \
         --cluster h200-sxm --gpus 1 --isl 128 --osl 32 --concurrency 16 --plan "tp=1" --timeout $((lim - 15)) --json)
    res=$("$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); print(f\"start-up {d['startup_s']:.1f} s, {d['output_tokens_per_s_per_gpu']:.0f} out tok/s, TTFT p90 {d['ttft_p90_s']*1e3:.1f} ms, TPOT p90 {d['tpot_p90_s']*1e3:.2f} ms\" if d.get('ok') else d.get('kind') + ': ' + d.get('message', '')[:200])" \
          "$OUTDIR/step5_sglang.json" 2>/dev/null || echo "no-json")
    say "RAN step5 sglang serve-trial (tp=1, 128/32 x16): rc=$rc $res"
  fi
fi
# ---- step 6: kernels -- the Triton kernels of kernels/ in bf16/fp16 against their torch references,
#      an SGLang-format block-config sweep and a (c, K) grid of the Weave-style kernel (EP 1)
if [ "$HAVE_CUDA" != 1 ]; then say "SKIP step6: $NO_CUDA"
else
  lim=$(step_limit 270)
  if [ "$lim" -lt 60 ]; then say "SKIP step6: whole-run limit ${TOTAL_S}s leaves ${lim}s"; else
    rc=$(run_cmd step6_kernels "$lim" "$PY" bench/kernels_gpu_sweep.py --out "$OUTDIR/kernels" \
         --budget-s $((lim - 20)))
    say "RAN step6 kernels: rc=$rc (kernels/kernels_gpu_sweep.json) $(tail -1 "$OUTDIR/step6_kernels.log" 2>/dev/null)"
  fi
fi

say "done in $(elapsed) s; results under $OUTDIR"
exit 0
