#!/usr/bin/env bash
# What a lent GPU machine runs (issue 4, part 5). One step per `device` call:
#   bash experiments/gpu_session.sh measure    # e2e iterations + traces + GPU tests + tiny CUDA calibration (~4 min)
#   bash experiments/gpu_session.sh calibrate  # tuner calibrate --device cuda --quick (~8 min)
#   bash experiments/gpu_session.sh bench      # its benchmarks only (--no-fit, ~5 min); then here: tuner calibrate --refit
#   bash experiments/gpu_session.sh e2e        # e2e rows, this instance's T1..T5, GPU tests, then as `stages` (~7 min)
#   bash experiments/gpu_session.sh stages     # the H100 stage-latency dataset alone (~9 min)
#   bash experiments/gpu_session.sh overheads  # e2e rows, then the T1..T5 measurement's spread in 2 processes (~5 min)
#   bash experiments/gpu_session.sh gemm       # right after `lease`, machine still warm: GEMMs only, --scale 4 (~250 s)
#   bash experiments/gpu_session.sh lease      # one call for a 15-minute lease: e2e rows + traces, the CUDA benchmarks
#                                              # (--no-fit), then with what is left of DEADLINE_S (default 560 s) the
#                                              # T1..T5 spread, the GPU tests and the GEMM layout probe
# Writes under $OUT (at most 8 files): session.log, e2e_h100_measured.json (lease: e2e_measured.json), traces.tar
# (the traces-*.tar.gz of each model: `tar xf traces.tar -C benchmarks/traces/NAME`), h100_pack.tar.gz (lease:
# gpu_pack.tar.gz, overheads_spread.json, gemm_layouts_cuda.{json,md}; gemm: gpu_gemm.tar.gz).
# The working tree must be under 64 MiB: run `bash experiments/device_tree.sh out` here first, `... back` after.
# The machine has PyTorch but not pydantic: its wheels travel in .whl (see docs/SESSION_NOTES.md).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
LOG=$OUT/session.log
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed" | tee -a "$LOG"; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
{ date -u; nvidia-smi; nproc; python3 -c "import torch, pydantic; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(), pydantic.__version__)"; } >>"$LOG" 2>&1
step=${1:-measure}
T0=$(date +%s)
left() { echo $(( ${DEADLINE_S:-560} - ($(date +%s) - T0) )); }  # seconds left of this call's budget
tar_traces() {  # each captured trace folder under /tmp/traces -> traces-NAME.tar.gz, all in one $OUT/traces.tar.gz
  mkdir -p /tmp/trace_archives                 # (one file back, not one per trace: a call returns at most 8 files)
  for d in /tmp/traces/*; do
    [ -d "$d" ] && tar czf "/tmp/trace_archives/traces-$(basename "$d").tar.gz" -C /tmp/traces "$(basename "$d")"
  done
  ls /tmp/trace_archives/*.tar.gz >/dev/null 2>&1 && tar cf "$OUT/traces.tar" -C /tmp/trace_archives .
}
if [ "$step" = measure ]; then
  echo "== e2e measure" >>"$LOG"
  timeout 240 python3 experiments/e2e_gpu.py --measure --out "$OUT/e2e_h100_measured.json" --traces /tmp/traces >>"$LOG" 2>&1
  echo "e2e rc=$?" >>"$LOG"
  tar_traces
  echo "== GPU tests" >>"$LOG"
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py >>"$LOG" 2>&1
  echo "pytest rc=$?" >>"$LOG"
elif [ "$step" = lease ]; then  # everything a short lease can give, most valuable first, each step bounded
  echo "== e2e measure + traces" >>"$LOG"
  timeout "${E2E_TIMEOUT:-170}" python3 experiments/e2e_gpu.py --measure --passes 5 --out "$OUT/e2e_measured.json" \
    --traces /tmp/traces >>"$LOG" 2>&1
  echo "e2e rc=$? ($(left) s left)" >>"$LOG"
  tar_traces
  echo "== calibrate --no-fit" >>"$LOG"
  timeout "$(( $(left) > 360 ? 360 : $(left) - 10 ))" python3 -m tuner.cli calibrate --device cuda --quick --no-fit \
    --out /tmp/gpu_pack >>"$LOG" 2>&1
  echo "calibrate rc=$? ($(left) s left)" >>"$LOG"
  [ -d /tmp/gpu_pack ] && tar czf "$OUT/gpu_pack.tar.gz" -C /tmp gpu_pack
  if [ "$(left)" -gt 40 ]; then
    timeout "$(( $(left) - 25 ))" python3 experiments/overheads_spread.py --device cuda --rounds 2 \
      --out "$OUT/overheads_spread.json" >>"$LOG" 2>&1
    echo "overheads_spread rc=$? ($(left) s left)" >>"$LOG"
  fi
  if [ "$(left)" -gt 15 ]; then
    timeout "$(( $(left) - 5 ))" python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py >>"$LOG" 2>&1
    echo "pytest rc=$? ($(left) s left)" >>"$LOG"
  fi
  if [ "$(left)" -gt 40 ]; then  # the step's GEMM layouts (NT / TN) against the NN the calibration times
    timeout "$(( $(left) - 10 ))" python3 experiments/gemm_layouts_cpu.py --device cuda --batches 1024 4096 16384 \
      --dtype fp32 bf16 --out "$OUT/gemm_layouts_cuda" >>"$LOG" 2>&1
    echo "gemm_layouts rc=$? ($(left) s left)" >>"$LOG"
  fi
elif [ "$step" = gemm ]; then  # the GEMMs alone at 4x the shapes (~250 s): their fits are short of samples
  echo "== calibrate --families gemm --scale 4 --no-fit" >>"$LOG"
  timeout "$(( $(left) - 10 ))" python3 -m tuner.cli calibrate --device cuda --quick --scale 4 --families gemm \
    --no-fit --out /tmp/gpu_gemm >>"$LOG" 2>&1
  echo "calibrate rc=$? ($(left) s left)" >>"$LOG"  # here: tuner calibrate --refit PACK --data-from gemm=THIS
  [ -d /tmp/gpu_gemm ] && tar czf "$OUT/gpu_gemm.tar.gz" -C /tmp gpu_gemm
elif [ "$step" = calibrate ]; then
  echo "== calibrate" >>"$LOG"
  timeout "${CAL_TIMEOUT:-540}" python3 -m tuner.cli calibrate --device cuda --quick --out /tmp/h100 >>"$LOG" 2>&1
  echo "calibrate rc=$?" >>"$LOG"
  [ -d /tmp/h100 ] && tar czf "$OUT/h100_pack.tar.gz" -C /tmp h100
elif [ "$step" = bench ]; then  # the CUDA benchmarks only; fit them here, no device needed: tuner calibrate --refit
  echo "== calibrate --no-fit" >>"$LOG"
  timeout "${CAL_TIMEOUT:-560}" python3 -m tuner.cli calibrate --device cuda --quick --no-fit --out /tmp/h100 >>"$LOG" 2>&1
  echo "calibrate rc=$?" >>"$LOG"
  [ -d /tmp/h100 ] && tar czf "$OUT/h100_pack.tar.gz" -C /tmp h100
elif [ "$step" = e2e ] || [ "$step" = stages ]; then  # e2e rows + this instance's T1..T5 (e2e), the H100 stage dataset
  [ "$step" = e2e ] && {
  echo "== e2e measure" >>"$LOG"
  timeout 150 python3 experiments/e2e_gpu.py --measure --passes 5 --out "$OUT/e2e_h100_measured.json" >>"$LOG" 2>&1
  echo "e2e rc=$?" >>"$LOG"
  timeout 60 python3 -m predictor.timing.calibration.overheads --device cuda --out "$OUT/overheads_h100.json" >>"$LOG" 2>&1
  echo "overheads rc=$?" >>"$LOG"
  timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py >>"$LOG" 2>&1
  echo "pytest rc=$?" >>"$LOG"
  }
  echo "== stage latencies" >>"$LOG"
  timeout "${STAGE_TIMEOUT:-300}" python3 experiments/collect_stage_latencies.py collect --device cuda --passes 4 \
    --repeats 3 --out "$OUT/h100_stage_latencies.json" >>"$LOG" 2>&1
  echo "stages rc=$?" >>"$LOG"
elif [ "$step" = overheads ]; then  # e2e rows, then the spread of the T1..T5 measurement, same instance
  echo "== e2e measure" >>"$LOG"
  timeout 150 python3 experiments/e2e_gpu.py --measure --passes 5 --out "$OUT/e2e_h100_measured.json" >>"$LOG" 2>&1
  echo "e2e rc=$?" >>"$LOG"
  for i in 1 2; do
    timeout 150 python3 experiments/overheads_spread.py --device cuda --rounds 3 --out "$OUT/overheads_spread_$i.json" >>"$LOG" 2>&1
    echo "overheads_spread $i rc=$?" >>"$LOG"
  done
elif [ "$step" = remeasure ]; then  # the e2e rows again, more passes; traces of other batches
  echo "== e2e measure" >>"$LOG"
  timeout 300 python3 experiments/e2e_gpu.py --measure --passes 7 --iters 60 --out "$OUT/e2e_h100_measured.json" \
    --traces /tmp/traces --trace-batches mlp=256 gpt=32 gpt-bf16=8 dlrm=16384 >>"$LOG" 2>&1
  echo "e2e rc=$?" >>"$LOG"
  tar_traces
elif [ "$step" = final ]; then  # the e2e rows and, on the same machine, traces for the what-if rows
  echo "== e2e measure + traces" >>"$LOG"
  timeout 400 python3 experiments/e2e_gpu.py --measure --passes 7 --iters 60 --out "$OUT/e2e_h100_measured.json" \
    --traces /tmp/traces >>"$LOG" 2>&1
  echo "e2e rc=$?" >>"$LOG"
  tar_traces
elif [ "$step" = hostcost ]; then  # what one eager op costs the host, with and without the profiler
  timeout 120 python3 experiments/host_op_cost.py --out "$OUT/host_op_cost.json" >>"$LOG" 2>&1
  echo "host_op_cost rc=$?" >>"$LOG"
  timeout 120 python3 -m predictor.timing.calibration.overheads --device cuda --out "$OUT/overheads_h100.json" >>"$LOG" 2>&1
  echo "overheads rc=$?" >>"$LOG"  # T1..T5 alone: tuner calibrate --refit assets/h100 --overheads FILE
elif [ "$step" = both ]; then  # calibrate, then the e2e rows again (no traces) and the GPU tests
  echo "== calibrate" >>"$LOG"
  timeout "${CAL_TIMEOUT:-400}" python3 -m tuner.cli calibrate --device cuda --quick --out /tmp/h100 >>"$LOG" 2>&1
  echo "calibrate rc=$?" >>"$LOG"
  [ -d /tmp/h100 ] && tar czf "$OUT/h100_pack.tar.gz" -C /tmp h100
  echo "== e2e measure" >>"$LOG"
  timeout 110 python3 experiments/e2e_gpu.py --measure --passes 5 --out "$OUT/e2e_h100_measured.json" >>"$LOG" 2>&1
  echo "e2e rc=$?" >>"$LOG"
  timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py >>"$LOG" 2>&1
  echo "pytest rc=$?" >>"$LOG"
fi
date -u >>"$LOG"
tail -40 "$LOG"
