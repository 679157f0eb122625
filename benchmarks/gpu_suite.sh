#!/usr/bin/env bash
# The GPU run: tests, then the matmul benchmark against its peers, then the
# quantiser bandwidth. From the repository root on the GPU machine:
#
#     bash benchmarks/gpu_suite.sh tests          # one device call
#     bash benchmarks/gpu_suite.sh bench quant    # a second call (~3-4 min)
#
# (All parts no longer fit in one device call of 600 s: on the H100 the GPU
# tests took 335 s serially at 12:00 on 2026-11-23 and the benchmark ~190 s.)
# Parts are the arguments, else $SUITE_PARTS, else all three.
#
# Writes at most 7 files to $OUT (default ./.out): suite.log, pytest.log,
# bench.log, results.json, results.png, quant.log, quant.json; each is capped
# at 15 MiB.
#
# Knobs (environment):
#   SUITE_PARTS="tests bench quant"   which parts run, in this order
#   SUITE_TESTS=gpu                   gpu: only tests marked requires_gpu (the CPU
#                                     interpret-mode tests run in CI); all: every test
#   SUITE_TEST_WORKERS=4              pytest-xdist processes sharing the GPU (the
#                                     tests are bound by compilation on the CPU);
#                                     1, or no pytest-xdist: one process
#   SUITE_PYTEST_ARGS=""              extra pytest arguments (e.g. "-k deepseek")
#   SUITE_SHAPES=deepseek_v3          --shapes of the matmul benchmark
#   SUITE_BACKENDS=all                --backends (jax_fp8 backends and every peer)
#   SUITE_OUT_DTYPE=bfloat16          --out_dtype
#   SUITE_ITERS=20                    --iters of both benchmarks
#   SUITE_BENCH_ARGS=""               extra arguments of blockwise_dot.py
#   SUITE_QUANT_SHAPES=auto           --shapes of quantize.py
#   SUITE_TESTS_TIMEOUT=540 SUITE_BENCH_TIMEOUT=480 SUITE_QUANT_TIMEOUT=40   seconds;
#                                     the benchmark starts no new shape after its
#                                     timeout - 45 s (--time_budget_s) and lists what it
#                                     did not run. The limits of the parts of one call
#                                     must add up to less than the device's 600 s.
set -u -o pipefail

OUT="${OUT:-$PWD/.out}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export XLA_PYTHON_CLIENT_PREALLOCATE=false
export PYTHONUNBUFFERED=1
export PATH="$PATH:/usr/local/cuda/bin"   # nvcc/nvdisasm for the FFI build and dumps
PY="${PYTHON:-python3}"

PARTS="${*:-${SUITE_PARTS:-tests bench quant}}"
SUITE_LOG="$OUT/suite.log"
: > "$SUITE_LOG"
say() { echo "[suite $(date -u +%H:%M:%S)] $*" | tee -a "$SUITE_LOG"; }

say "parts: $PARTS; OUT=$OUT"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
  "$PY" -c 'import sys, jax; print("python", sys.version.split()[0], "jax", jax.__version__, jax.devices())' 2>&1
  "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tail -1
  command -v nvcc >/dev/null && nvcc --version | tail -1
} >> "$SUITE_LOG" 2>&1
STATUS=0

run_part() {  # name timeout log command...
  local name="$1" limit="$2" log="$3"; shift 3
  local t0=$SECONDS rc
  say "$name: $* (limit ${limit}s, log $(basename "$log"))"
  timeout -k 15 "$limit" "$@" > "$log" 2>&1
  rc=$?
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    say "$name: TIMED OUT after ${limit}s (raise SUITE_${name^^}_TIMEOUT or narrow the part)"
  fi
  say "$name: exit $rc after $((SECONDS - t0)) s"
  [ $rc -eq 0 ] || STATUS=1
  return 0
}

for part in $PARTS; do
  case "$part" in
    tests)
      PLUGIN_DIR="$(mktemp -d)"
      # Keeps only tests that carry the requires_gpu skip marker (tests/conftest.py).
      cat > "$PLUGIN_DIR/gpu_only_plugin.py" <<'EOF'
def pytest_collection_modifyitems(config, items):
  keep, drop = [], []
  for item in items:
    gpu = any("needs an NVIDIA GPU" in str(m.kwargs.get("reason", ""))
              for m in item.iter_markers("skipif"))
    (keep if gpu else drop).append(item)
  items[:] = keep
  config.hook.pytest_deselected(items=drop)
EOF
      plugin=()
      if [ "${SUITE_TESTS:-gpu}" = "gpu" ]; then
        plugin=(-p gpu_only_plugin)
      fi
      # Several processes share the GPU: each test compiles on the CPU for most
      # of its time. -v: a line per finished test, so a timeout shows where.
      workers=()
      n_workers="${SUITE_TEST_WORKERS:-4}"
      if [ "$n_workers" -gt 1 ] && "$PY" -c 'import xdist' 2>/dev/null; then
        workers=(-n "$n_workers")
      fi
      # shellcheck disable=SC2086
      PYTHONPATH="$PLUGIN_DIR:$PYTHONPATH" run_part tests "${SUITE_TESTS_TIMEOUT:-540}" \
        "$OUT/pytest.log" "$PY" -m pytest -v -rfEs --durations=15 -p no:cacheprovider \
        "${plugin[@]}" "${workers[@]}" ${SUITE_PYTEST_ARGS:-} tests
      rm -rf "$PLUGIN_DIR"
      tail -n 5 "$OUT/pytest.log" | tee -a "$SUITE_LOG"
      ;;
    bench)
      limit="${SUITE_BENCH_TIMEOUT:-480}"
      # shellcheck disable=SC2086
      run_part bench "$limit" "$OUT/bench.log" \
        "$PY" benchmarks/blockwise_dot.py --shapes="${SUITE_SHAPES:-deepseek_v3}" \
        --time_budget_s=$((limit > 90 ? limit - 45 : limit / 2)) \
        --backends="${SUITE_BACKENDS:-all}" --out_dtype="${SUITE_OUT_DTYPE:-bfloat16}" \
        --iters="${SUITE_ITERS:-20}" --check --json_out="$OUT/results.json" \
        --plot_out="$OUT/results.png" ${SUITE_BENCH_ARGS:-}
      # The summary table (it follows the line "summary (...").
      sed -n '/^summary (/,$p' "$OUT/bench.log" | tee -a "$SUITE_LOG"
      ;;
    quant)
      run_part quant "${SUITE_QUANT_TIMEOUT:-40}" "$OUT/quant.log" \
        "$PY" benchmarks/quantize.py --shapes="${SUITE_QUANT_SHAPES:-auto}" \
        --iters="${SUITE_ITERS:-20}" --json_out="$OUT/quant.json"
      tail -n 20 "$OUT/quant.log" | tee -a "$SUITE_LOG"
      ;;
    *)
      say "unknown part '$part' (parts: tests bench quant)"; STATUS=1 ;;
  esac
done

# Keep every file within what the device run hands back (16 MiB per file).
for f in "$OUT"/*; do
  [ -f "$f" ] || continue
  if [ "$(stat -c %s "$f")" -gt $((15 * 1024 * 1024)) ]; then
    tail -c $((15 * 1024 * 1024)) "$f" > "$f.tmp" && mv "$f.tmp" "$f"
    say "$(basename "$f") was over 15 MiB: kept its last 15 MiB"
  fi
done
say "done, status $STATUS (files: $(cd "$OUT" && ls | tr '\n' ' '))"
exit $STATUS
