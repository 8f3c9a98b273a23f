#!/usr/bin/env bash
# What a lent GPU machine runs. One step per call, each bounded:
#   bash experiments/gpu.sh measure    # e2e iterations + one trace per model (experiments/e2e_gpu.py), GPU tests (~4 min)
#   bash experiments/gpu.sh lease      # one call for a 15-minute lease: e2e iterations + traces, then the CUDA
#                                      # benchmarks (tuner calibrate --no-fit) and the GPU tests with what is left
#                                      # of DEADLINE_S (default 560 s)
#   bash experiments/gpu.sh calibrate  # tuner calibrate --device cuda --quick (~8 min)
#   bash experiments/gpu.sh bench      # its benchmarks only (--no-fit, ~5 min); then here: tuner calibrate --refit
#   bash experiments/gpu.sh gemm       # GEMMs only at 4x the shapes (--no-fit, ~250 s); then here:
#                                      # tuner calibrate --refit PACK --data-from gemm=THIS
#   bash experiments/gpu.sh stages     # the stage-latency data set of the PredTOP tables (~9 min)
# Writes under $OUT: gpu.log, e2e_measured.json, traces.tar (the traces-*.tar.gz of each model; here:
# `tar xf traces.tar -C benchmarks/traces/NAME` and `python experiments/e2e_gpu.py --add e2e_measured.json
# --name NAME --gpu GPU`), gpu_pack.tar.gz (lease, calibrate, bench), gpu_gemm.tar.gz (gemm),
# stage_latencies.json (stages).
# If the machine lacks a Python package the project needs (e.g. pydantic), put its wheels in .whl/.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
LOG=$OUT/gpu.log
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
tar_traces() {  # each captured trace folder under /tmp/traces -> traces-NAME.tar.gz, all in one $OUT/traces.tar
  mkdir -p /tmp/trace_archives
  for d in /tmp/traces/*; do
    [ -d "$d" ] && tar czf "/tmp/trace_archives/traces-$(basename "$d").tar.gz" -C /tmp/traces "$(basename "$d")"
  done
  ls /tmp/trace_archives/*.tar.gz >/dev/null 2>&1 && tar cf "$OUT/traces.tar" -C /tmp/trace_archives .
}
calibrate() {  # tuner calibrate --device cuda --quick into /tmp/gpu_pack, archived as $OUT/gpu_pack.tar.gz
  timeout "$1" python3 -m tuner.cli calibrate --device cuda --quick "${@:2}" --out /tmp/gpu_pack >>"$LOG" 2>&1
  echo "calibrate rc=$? ($(left) s left)" >>"$LOG"
  [ -d /tmp/gpu_pack ] && tar czf "$OUT/gpu_pack.tar.gz" -C /tmp gpu_pack
}
gpu_tests() {
  timeout "$1" python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py >>"$LOG" 2>&1
  echo "pytest rc=$? ($(left) s left)" >>"$LOG"
}
if [ "$step" = measure ] || [ "$step" = lease ]; then
  echo "== e2e measure + traces" >>"$LOG"
  timeout "${E2E_TIMEOUT:-240}" python3 experiments/e2e_gpu.py --measure --passes 5 --out "$OUT/e2e_measured.json" \
    --traces /tmp/traces >>"$LOG" 2>&1
  echo "e2e rc=$? ($(left) s left)" >>"$LOG"
  tar_traces
  if [ "$step" = lease ] && [ "$(left)" -gt 60 ]; then
    echo "== calibrate --no-fit" >>"$LOG"
    calibrate "$(( $(left) > 360 ? 360 : $(left) - 10 ))" --no-fit
  fi
  [ "$(left)" -gt 15 ] && gpu_tests "$(( $(left) - 5 ))"
elif [ "$step" = calibrate ]; then
  calibrate "${CAL_TIMEOUT:-540}"
elif [ "$step" = bench ]; then
  calibrate "${CAL_TIMEOUT:-560}" --no-fit
elif [ "$step" = gemm ]; then
  echo "== calibrate --families gemm --scale 4 --no-fit" >>"$LOG"
  timeout "$(( $(left) - 10 ))" python3 -m tuner.cli calibrate --device cuda --quick --scale 4 --families gemm \
    --no-fit --out /tmp/gpu_gemm >>"$LOG" 2>&1
  echo "calibrate rc=$? ($(left) s left)" >>"$LOG"
  [ -d /tmp/gpu_gemm ] && tar czf "$OUT/gpu_gemm.tar.gz" -C /tmp gpu_gemm
elif [ "$step" = stages ]; then
  echo "== stage latencies" >>"$LOG"
  timeout "${STAGE_TIMEOUT:-540}" python3 experiments/collect_stage_latencies.py collect --device cuda --passes 4 \
    --repeats 3 --out "$OUT/stage_latencies.json" >>"$LOG" 2>&1
  echo "stages rc=$?" >>"$LOG"
else
  echo "unknown step $step (measure, lease, calibrate, bench, gemm, stages)" | tee -a "$LOG"
  exit 2
fi
date -u >>"$LOG"
tail -40 "$LOG"
