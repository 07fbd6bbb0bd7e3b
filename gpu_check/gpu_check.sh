#!/usr/bin/env bash
# Vigil's GPU acceptance run: one command, sized for under 8 minutes on one H200 and bounded by 9
# (gpu_check/README.md).
#
#   gpu_check/gpu_check.sh                 # on a CUDA machine, after `make setup`
#   gpu_check/gpu_check.sh --device cpu    # a dry run of every step on the CPU, small sizes (tests/test_gpu_check.py)
#
# Each step prints PASS, FAIL or SKIP with its time, and a summary table ends the run; each step's whole output is
# in $GPU_CHECK_DIR (default bench-results/gpu-check-<time>). Exits 1 if any step failed.
set -u
cd "$(dirname "$0")/.."

DEVICE=cuda
if [ "${1:-}" = "--device" ]; then
    DEVICE="${2:?--device needs a value}"
fi
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
# The whole run fits one device command (10 minutes at most): a step gets what is left of this when its own
# limit is longer, and a step with no time left is not run and FAILs (a check not made has not passed).
BUDGET_S="${GPU_CHECK_BUDGET_S:-540}"
OUT="${GPU_CHECK_DIR:-bench-results/gpu-check-$(date +%Y%m%d-%H%M%S)}"
# GPU_CHECK_STEPS="decode-graphs api" runs those steps alone: a second try of the failed ones within a lease.
ONLY="${GPU_CHECK_STEPS:-}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

names=()
results=()
times=()
details=()

# step NAME SECONDS DETAIL_PATTERN COMMAND...: run COMMAND within SECONDS; PASS on exit 0 (SKIP where it printed a
# SKIP line and nothing failed), else FAIL. The summary shows the last output line that matches DETAIL_PATTERN.
step() {
    local name=$1 limit=$2 pattern=$3
    shift 3
    local log="$OUT/$name.log" started=$SECONDS result detail left=$((BUDGET_S - SECONDS))
    if [ -n "$ONLY" ] && [[ " $ONLY " != *" $name "* ]]; then
        return
    fi
    echo "== $name: $*"
    if [ "$left" -lt 20 ]; then
        echo "FAIL $name: not run, the run's ${BUDGET_S} s are spent"
        names+=("$name"); results+=(FAIL); times+=(0); details+=("not run: the ${BUDGET_S} s budget is spent")
        return
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    timeout --kill-after=30 "$limit" "$@" > "$log" 2>&1
    local status=$?
    grep -E '^(PASS|FAIL|SKIP) ' "$log" | sed 's/^/   /'
    if [ "$status" -eq 0 ] && grep -q '^SKIP ' "$log" && ! grep -q '^PASS ' "$log"; then
        result=SKIP
    elif [ "$status" -eq 0 ]; then
        result=PASS
    else
        result=FAIL
    fi
    detail=$(grep -E "$pattern" "$log" | tail -n 1 | cut -c1-110)
    if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
        detail="timed out after ${limit} s"
    elif [ "$result" = FAIL ] && [ -z "$detail" ]; then
        detail="exit status $status: $(tail -n 1 "$log" | cut -c1-90)"
    fi
    echo "$result $name ($((SECONDS - started)) s) $detail"
    names+=("$name")
    results+=("$result")
    times+=("$((SECONDS - started))")
    details+=("$detail")
}

if [ "$DEVICE" = cpu ]; then
    KERNELS=(--smoke)
    OFFLINE=(--dtype float32 --input-len 16 --output-len 8 --hf-batch-size 4 --hf-single-requests 1)
    OFFLINE_64=(--num-prompts 4)
    OFFLINE_256=(--num-prompts 8 --max-num-seqs 8)
    API_TESTS=(tests/test_api_streaming.py)
else
    KERNELS=()
    OFFLINE=(--dtype bfloat16)
    OFFLINE_64=(--num-prompts 64)
    OFFLINE_256=(--num-prompts 256 --max-num-seqs 256 --hf-batch-size 64)
    API_TESTS=(tests/test_api_openai.py tests/test_api_streaming.py)
fi

echo "gpu_check on $DEVICE; logs in $OUT"
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())"
step kernels 300 '^target|FAIL|^device' "$PY" -m gpu_check.kernels_gpu "${KERNELS[@]}"
step engine 240 '^(PASS|FAIL) greedy' "$PY" -m gpu_check.engine_gpu --device "$DEVICE"
step decode-graphs 150 '^speed|^FAIL|^SKIP' "$PY" -m gpu_check.decode_graphs_gpu --device "$DEVICE"
# The API tests start their own server with --device auto: the GPU on a CUDA machine.
step api 300 'passed|failed|error' env TRITON_INTERPRET=0 "$PY" -m pytest -q -p no:cacheprovider "${API_TESTS[@]}"
step metrics 180 '^(FAIL|SKIP|PASS) gpu|^SKIP' "$PY" -m gpu_check.server_gpu --device "$DEVICE"
step offline-64 240 '^vigil engine' "$PY" -m server bench offline --device "$DEVICE" "${OFFLINE[@]}" "${OFFLINE_64[@]}"
step offline-256 300 '^vigil engine' "$PY" -m server bench offline --device "$DEVICE" "${OFFLINE[@]}" "${OFFLINE_256[@]}"
step serve-64 300 '^(PASS|FAIL) Vigil' "$PY" -m gpu_check.serve_gpu --device "$DEVICE" --out "$OUT"
step tensor-parallel 240 '^(FAIL|SKIP)|^PASS' "$PY" -m gpu_check.tensor_parallel_gpu --device "$DEVICE"

echo
echo "== summary ($DEVICE, ${SECONDS} s in all; logs in $OUT)"
printf '%-16s %-5s %6s  %s\n' step result secs detail
failed=0
for i in "${!names[@]}"; do
    printf '%-16s %-5s %6s  %s\n' "${names[$i]}" "${results[$i]}" "${times[$i]}" "${details[$i]}"
    [ "${results[$i]}" = FAIL ] && failed=1
done
exit "$failed"
