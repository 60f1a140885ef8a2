#!/usr/bin/env bash
# The GPU check, run from the repo root on a machine with one CUDA GPU (and its own torch):
# instrumented runs on CUDA + NCCL (one rank: NCCL launches no collective kernels with one rank),
# tracekit.profile on a small CUDA job, `tracekit analyze` of each, run folders packed into OUT.
set -u
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT" /tmp/gpu_runs
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
runs=()
for spec in "dp" "dp --precision bf16-mixed" "zero3 --prefetch 1" "fsdp"; do
  echo "=== tracekit run $spec --nproc 1 --device cuda --backend nccl"
  d=$(timeout 120 python3 -m tracekit.cli run $spec --nproc 1 --steps 2 --device cuda --backend nccl --out /tmp/gpu_runs 2>/tmp/gpu_runs/last.err | tail -1)
  tail -2 /tmp/gpu_runs/last.err
  [ -n "$d" ] && runs+=("$d")
done
echo "=== tracekit.profile on a small CUDA job"
timeout 120 python3 scripts/gpu_profile_job.py /tmp/gpu_runs/user 2>&1 | tail -3
for d in "${runs[@]}" /tmp/gpu_runs/user/*; do
  [ -d "$d" ] || continue
  echo "=== analyze $d"
  timeout 60 python3 -m tracekit.cli analyze "$d" 2>&1 | tail -12
  python3 - "$d" <<'PY'
import json, sys
s = json.load(open(sys.argv[1] + "/analysis/summary.json"))
print("window", s["window"]["kind"], s["window"]["steps"], "| memory", (s.get("memory") or {}).get("per_rank"))
print("collectives", json.dumps(s["collectives"]["per_op"])[:400])
print("nccl", json.dumps(s.get("nccl"))[:300], "| warnings", s["warnings"][:4])
PY
done
tar czf "$OUT/gpu_runs.tar.gz" -C /tmp gpu_runs --exclude='*.events.parquet' 2>/dev/null
ls -la "$OUT"
