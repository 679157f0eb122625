#!/usr/bin/env bash
# The GPU run: tests, benchmarks against their peers, the no-regression check.
# From the repository root on the GPU machine, one device call (< 600 s) each:
#
#     bash benchmarks/gpu_suite.sh tests          # the GPU tests
#     bash benchmarks/gpu_suite.sh bench quant    # dense 18 shapes, every peer; quantisers
#     bash benchmarks/gpu_suite.sh grouped        # MoE grouped GEMMs (issue 20)
#     bash benchmarks/gpu_suite.sh training mlp   # one layer fwd+bwd, wgrad (issue 21); MLP (22)
#     bash benchmarks/gpu_suite.sh compare        # old vs new tree, 18 shapes, alternated
#     bash benchmarks/gpu_suite.sh multigpu       # on >= 2 GPUs (nvidia-h200-x2/-x4): the
#                                                 # grouped ops and jax_fp8.dense sharded over
#                                                 # all GPUs, and tests/test_sharding_gpu.py
#
# (All parts do not fit in one device call of 600 s: on the H100 the GPU tests
# took 335 s serially at 12:00 on 2026-11-23 and the benchmark ~190 s.)
# Parts are the arguments, else $SUITE_PARTS, else "tests bench quant".
#
# Writes to $OUT (default ./.out): suite.log, and per part: pytest.log; bench.log,
# results.json, results.png; quant.log, quant.json; grouped.log, grouped.json,
# grouped.png; training.log, training.json, training.png; mlp.log, mlp.json,
# mlp.png; compare.log, compare.json; multigpu.log (`nvidia-smi topo -m`, then
# pytest with every check's line, -rP). Each file is capped at 15 MiB.
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
#   SUITE_BACKENDS=all                --backends (jax_fp8 backends and every peer,
#                                     DeepGEMM included where `import deep_gemm` works)
#   SUITE_OUT_DTYPE=bfloat16          --out_dtype
#   SUITE_ITERS=20                    --iters of every benchmark
#   SUITE_BENCH_ARGS=""               extra arguments of blockwise_dot.py
#   SUITE_QUANT_SHAPES=auto           --shapes of quantize.py
#   SUITE_GROUPED_CASES=deepseek_v3   --cases of grouped.py (contiguous / masked: half)
#   SUITE_GROUPED_ARGS=""             extra arguments of grouped.py (e.g.
#                                     --mgpu_config=64x256x64x4x2)
#   SUITE_TRAINING_ARGS=""            extra arguments of training.py (e.g. --kinds=wgrad)
#   SUITE_MLP_ARGS=""                 extra arguments of mlp.py
#   SUITE_MULTIGPU_ARGS=""            extra pytest arguments of the multigpu part
#   SUITE_OLD_TREE=scratch/old        compare: the old checkout (e.g. `mkdir -p
#                                     scratch/old && git archive main | tar -x -C
#                                     scratch/old`, carried to the device)
#   SUITE_COMPARE_ROUNDS=2            compare: rounds of (old, new)
#   SUITE_COMPARE_ARGS="--shapes=deepseek_v3 --backends=pallas"   compare: flags of
#                                     both trees' blockwise_dot.py (+ --iters)
#   SUITE_COMPARE_SCRIPT=blockwise_dot.py   compare: the benchmark both trees run (e.g.
#                                     grouped.py with SUITE_COMPARE_ARGS="--cases=deepseek_v3
#                                     --backends=pallas": the grouped kernels' paths)
#   SUITE_TESTS_TIMEOUT=540 SUITE_BENCH_TIMEOUT=480 SUITE_QUANT_TIMEOUT=40
#   SUITE_GROUPED_TIMEOUT=540 SUITE_TRAINING_TIMEOUT=300 SUITE_MLP_TIMEOUT=240
#   SUITE_COMPARE_TIMEOUT=560 SUITE_MULTIGPU_TIMEOUT=420
#                                     seconds; a benchmark starts no new case after
#                                     its timeout - 45 s (--time_budget_s) and lists
#                                     what it did not run. The limits of the parts of
#                                     one call must add up to less than the device's
#                                     600 s.
# DeepGEMM: `bash tools/build_deepgemm.sh` on the device builds it (see there); it
# JIT-compiles its kernels at first use: DG_JIT_CACHE_DIR on a carried
# path keeps them across device calls.
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
    grouped|training|mlp)
      # The benchmarks on the harness: same flags, a summary table, JSON and plot.
      upper="${part^^}"
      timeout_var="SUITE_${upper}_TIMEOUT"
      case "$part" in
        grouped) default_limit=540 ;;
        training) default_limit=300 ;;
        *) default_limit=240 ;;
      esac
      limit="${!timeout_var:-$default_limit}"
      args_var="SUITE_${upper}_ARGS"
      cases=()
      if [ "$part" = grouped ]; then
        cases=(--cases="${SUITE_GROUPED_CASES:-deepseek_v3}")
      fi
      # shellcheck disable=SC2086
      run_part "$part" "$limit" "$OUT/$part.log" \
        "$PY" "benchmarks/$part.py" "${cases[@]}" \
        --time_budget_s=$((limit > 90 ? limit - 45 : limit / 2)) --iters="${SUITE_ITERS:-20}" \
        --json_out="$OUT/$part.json" --plot_out="$OUT/$part.png" ${!args_var:-}
      sed -n '/^summary (/,$p' "$OUT/$part.log" | tee -a "$SUITE_LOG"
      ;;
    compare)
      # A benchmark (the 18 dense shapes by default) of an old and this tree, alternated.
      limit="${SUITE_COMPARE_TIMEOUT:-560}"
      bench_args="${SUITE_COMPARE_ARGS:---shapes=deepseek_v3 --backends=pallas}"
      run_part compare "$limit" "$OUT/compare.log" \
        "$PY" benchmarks/alternate.py --old_tree="${SUITE_OLD_TREE:-scratch/old}" --new_tree=. \
        --script="${SUITE_COMPARE_SCRIPT:-blockwise_dot.py}" \
        --rounds="${SUITE_COMPARE_ROUNDS:-2}" --time_budget_s=$((limit - 20)) \
        --bench_args="$bench_args --iters=${SUITE_ITERS:-20}" --json_out="$OUT/compare.json"
      sed -n '/^new\/old = /,$p' "$OUT/compare.log" | tee -a "$SUITE_LOG"
      ;;
    multigpu)
      # Issue 23: one pytest process over every GPU (the tests build meshes of all
      # of them, so no xdist). NVLink multicast (NVLS) stays off, as the device
      # machines require. The log starts with the GPUs' interconnect.
      export NCCL_NVLS_ENABLE=0
      # shellcheck disable=SC2086
      run_part multigpu "${SUITE_MULTIGPU_TIMEOUT:-420}" "$OUT/multigpu.log" \
        bash -c 'nvidia-smi topo -m 2>&1; echo; exec "$@"' multigpu \
        "$PY" -m pytest -v -rfEsP --durations=20 -p no:cacheprovider \
        ${SUITE_MULTIGPU_ARGS:-} tests/test_multigpu.py tests/test_sharding_gpu.py
      # Per test its outcome, each failed check, and pytest's last line.
      { grep -E '::\S+ (PASSED|FAILED|ERROR|SKIPPED)' "$OUT/multigpu.log"
        grep -E '^\[[^]]*\] FAILED ' "$OUT/multigpu.log" | head -n 40
        tail -n 1 "$OUT/multigpu.log"; } | tee -a "$SUITE_LOG"
      ;;
    *)
      say "unknown part '$part' (parts: tests bench quant grouped training mlp compare multigpu)"
      STATUS=1 ;;
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
