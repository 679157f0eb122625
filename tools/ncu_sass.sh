#!/usr/bin/env bash
# Per-SASS-instruction profile of the Hopper kernel under Nsight Compute, on the GPU machine.
#
#   bash tools/ncu_sass.sh 4096x2112x7168 [MxNxK ...]     (from the repository root)
#   bash tools/ncu_sass.sh ragged:8x4096x4096x7168 masked:1x1280x4096x7168
#
# For each shape: runs the pallas_sm90 backend of blockwise_fp8_dot four times
# (tools/one_call.py; a KIND:DIMS case of tools/spill_check.py runs that kernel at its
# default config: grouped GEMMs, weight gradients, GLUs) and profiles the last launch
# (`ncu --set full --import-source yes --clock-control none`), then writes to $OUT
# (default ./.out; a case's ':' is '_' in the names):
#   sass_<shape>.csv.gz    one row per SASS instruction: its text, executions, stall samples
#   details_<shape>.csv    the report's metrics (cycles, instructions, throughputs, ...)
# Summarise them with `python3 tools/sass_summary.py $OUT/sass_<shape>.csv.gz
# --details=$OUT/details_<shape>.csv` (any machine). About 15 s per shape on the H100.
# Knobs: NCU_ARGS (extra ncu flags, e.g. "--launch-skip 5"), ONE_CALL_ARGS (e.g.
# "--out_dtype=float32", or "--variant=a_scale_window=4" for a config variant), NCU_TAG
# (a suffix of the output names, to keep two profiles of one shape apart), NCU_KERNEL
# (ncu's -k filter of the kernel to profile, default regex:mosaic_gpu). DeepGEMM's GEMM
# beside ours (where `import deep_gemm` works):
#   NCU_KERNEL=regex:fp8_gemm NCU_TAG=_deepgemm ONE_CALL_ARGS=--backend=deepgemm \
#     bash tools/ncu_sass.sh 1536x1760x57344
set -u -o pipefail
OUT="${OUT:-$PWD/.out}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" XLA_PYTHON_CLIENT_PREALLOCATE=false
export PATH="$PATH:/usr/local/cuda/bin"
[ $# -ge 1 ] || { echo "usage: bash tools/ncu_sass.sh MxNxK|KIND:DIMS ..." >&2; exit 2; }
status=0
for shape in "$@"; do
  tag="${shape//:/_}${NCU_TAG:-}"   # (no ':' in the file names)
  rep="$OUT/profile_$tag"
  # The kernel's calls are the only launches whose name has "mosaic_gpu" (DeepGEMM's:
  # "fp8_gemm"); skip three of four.
  if ncu --launch-skip 3 --launch-count 1 -k "${NCU_KERNEL:-regex:mosaic_gpu}" \
         --clock-control none --set full \
         --import-source yes ${NCU_ARGS:-} -f -o "$rep" \
         python3 tools/one_call.py "$shape" ${ONE_CALL_ARGS:-} > "$OUT/ncu_$tag.log" 2>&1; then
    ncu --import "$rep.ncu-rep" --page source --csv --print-source sass | gzip > "$OUT/sass_$tag.csv.gz"
    ncu --import "$rep.ncu-rep" --page details --csv > "$OUT/details_$tag.csv"
    echo "ncu_sass: $shape -> $OUT/sass_$tag.csv.gz, $OUT/details_$tag.csv"
  else
    echo "ncu_sass: $shape failed (see $OUT/ncu_$tag.log):" >&2; tail -5 "$OUT/ncu_$tag.log" >&2
    status=1
  fi
  rm -f "$rep.ncu-rep"   # large; the two exports keep what the summary reads
done
exit $status
