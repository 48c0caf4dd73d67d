#!/usr/bin/env bash
# The whole held-out CPU procedure of issue 10 in one go, on a fresh MOETUNE_HOME:
# the README's main job (profile, then the 8-trial quickstart study), then bench/heldout_cpu.py.
#
#   bash bench/heldout_cpu_run.sh OUT_DIR        (about 10-12 minutes on 2 cores)
#
# OUT_DIR gets home/ (tables, Ray token), studies/quickstart/, heldout/ (CSV + PNG) and the logs.
# Between the phases it prints a host-speed probe (seconds of a 5M-iteration Python loop): on a
# shared VM the host's speed drifts by 20-30% within minutes, and the tables (profile phase) and
# the trials (study and held-out phases) are only comparable when it held still. Run it with
# nothing else on the machine.
set -euo pipefail
out=${1:?usage: bash bench/heldout_cpu_run.sh OUT_DIR}
repo=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" MOETUNE_HOME="$out/home"
cd "$out"
rm -rf home studies heldout
probe() {
  echo "$(date -u +%H:%M:%S) $1: load $(cut -d' ' -f1-3 /proc/loadavg); host probe $(python -c "
import time
t = time.perf_counter(); s = 0
for i in range(5_000_000): s += i
print(round(time.perf_counter() - t, 3))") s"
}
probe "before profile"
/usr/bin/time -f "profile %e s wall" moetune profile --cluster cpu-local --budget-min 4 > profile.log 2>&1
probe "before study"
/usr/bin/time -f "study %e s wall" moetune tune --model tiny-moe --cluster cpu-local --gbs 16 --seq 256 \
  --study quickstart --trials 8 > tune.log 2>&1
probe "before held-out"
python "$repo/bench/heldout_cpu.py" --out "$out/heldout" --study-dir "$out/studies/quickstart" --passes 3 \
  | tee heldout.log | tail -12
probe "after held-out"
