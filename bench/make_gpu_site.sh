#!/usr/bin/env bash
# Build bench/.gpu_site/: what bench/gpu_check.sh needs on a GPU machine that has torch but no
# package index (torch 2.11, CUDA 13, Python 3.12; no megatron-core, no TransformerEngine).
#
#   bash bench/make_gpu_site.sh            # run here, where megatron-core is installed
#
# It copies, from this machine's installed packages (never `pip install .`, which would pin
# torch 2.13 over the GPU machine's own torch):
#   megatron/            the installed megatron-core tree (pure Python; the one compiled module,
#                        megatron/core/datasets/helpers_cpp*.so, is left out: trials do not import it)
#   yaml/ packaging/ tqdm/   pure-Python dependencies a bare torch environment lacks (PyYAML
#                        without its C extension falls back to its pure-Python loader)
# and downloads one binary wheel for the GPU machine's Python, used there only if it lacks numpy:
#   wheels/numpy-*-cp312-*.whl   (pip download --only-binary, no install; skipped with a message
#                        if the index cannot be reached: gpu_check.sh then needs numpy there)
# The folder is git-ignored; pass it to the device tool with carry=["bench/.gpu_site"].
set -euo pipefail
cd "$(dirname "$0")/.."
SITE=bench/.gpu_site
PY=${PYTHON:-python}
GPU_PY_VERSION=${GPU_PY_VERSION:-3.12}
rm -rf "$SITE"
mkdir -p "$SITE/wheels"
pkgdir() { "$PY" -W ignore -c "import importlib, os, sys; m = importlib.import_module(sys.argv[1]); print(os.path.dirname(m.__file__))" "$1"; }
MEG=$(pkgdir megatron.core)
cp -r "$(dirname "$MEG")" "$SITE/megatron"
for mod in yaml packaging tqdm; do
  cp -r "$(pkgdir "$mod")" "$SITE/$mod"
done
find "$SITE" \( -name "__pycache__" -o -name "*.so" -o -name "*.pyc" \) -prune -exec rm -rf {} +
"$PY" - "$SITE" <<'PY'
import importlib.metadata as md, json, sys
site = sys.argv[1]
vers = {d: md.version(d) for d in ("megatron-core", "PyYAML", "packaging", "tqdm")}
json.dump(vers, open(f"{site}/VERSIONS.json", "w"), indent=1)
print("copied", vers)
PY
if timeout 180 "$PY" -m pip download --no-deps --only-binary=:all: --python-version "$GPU_PY_VERSION" \
    --implementation cp --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    "numpy<2.4" -d "$SITE/wheels" >/dev/null 2>&1; then
  echo "numpy wheel for Python $GPU_PY_VERSION: $(ls "$SITE/wheels")"
else
  echo "no numpy wheel downloaded (no package index here?): the GPU machine must have numpy"
fi
du -sh "$SITE"
