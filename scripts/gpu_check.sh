#!/usr/bin/env bash
# The GPU check, run from the repo root on a machine with one CUDA GPU (and its own torch):
#  1. which gloo collectives take CUDA tensors (scripts/gpu_gloo_probe.py);
#  2. instrumented runs with CUDA tensors, two gloo ranks sharing the GPU;
#  3. one NCCL rank (NCCL needs a GPU per rank: with one rank it launches no collective kernels);
#  4. tracekit.profile on a small CUDA job;
# then `tracekit analyze` of each; run folders packed into OUT.
set -u
OUT=${OUT:-/tmp/gpu_check}
RUNS=/tmp/gpu_runs
mkdir -p "$OUT" "$RUNS"
exec > >(tee "$OUT/gpu_check.log") 2>&1   # the whole log comes back, not only a tail
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
echo "=== gloo collectives on CUDA tensors"
timeout 120 python3 scripts/gpu_gloo_probe.py 2>&1 | grep -v Warning | tail -12
runs=()
run() {   # run ARGS...: one tracekit run, its folder appended to runs
  echo "=== tracekit run $*"
  local t0=$SECONDS d
  d=$(timeout 150 python3 -m tracekit.cli run "$@" --steps 3 --device cuda --out "$RUNS" 2>"$RUNS/last.err" | tail -1)
  tail -3 "$RUNS/last.err"
  echo "    ($((SECONDS - t0)) s)"
  [ -n "$d" ] && [ -d "$d" ] && runs+=("$d")
}
for s in dp tp pp-1f1b zero2 zero3 fsdp; do run "$s" --nproc 2 --backend gloo; done
run pp-gpipe --nproc 4 --microbatches 8 --backend gloo
run fsdp --nproc 1 --backend nccl
echo "=== tracekit.profile on a small CUDA job"
timeout 120 python3 scripts/gpu_profile_job.py "$RUNS/user" 2>&1 | tail -3
for d in "${runs[@]}" "$RUNS"/user/*; do
  [ -d "$d" ] || continue
  echo "=== analyze $d"
  timeout 90 python3 -m tracekit.cli analyze "$d" 2>&1 | tail -14
  python3 - "$d" <<'PY'
import json, sys
s = json.load(open(sys.argv[1] + "/analysis/summary.json"))
print("window", s["window"]["kind"], s["window"]["steps"], "| memory", json.dumps((s.get("memory") or {}).get("per_rank"))[:300])
print("collectives", json.dumps(s["collectives"].get("per_op"))[:300])
print("overlap", json.dumps(s.get("overlap"))[:300])
print("pipeline", json.dumps({k: v for k, v in (s.get("pipeline") or {}).items() if not isinstance(v, list)})[:300])
print("warnings", s["warnings"][:5])
PY
done
tar czf "$OUT/gpu_runs.tar.gz" --exclude='*.events.parquet' -C /tmp gpu_runs 2>/dev/null
ls -la "$OUT"
