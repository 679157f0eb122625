#!/usr/bin/env bash
# Builds DeepGEMM (a peer of the benchmarks, never a dependency) on the GPU machine.
#
#   bash tools/build_deepgemm.sh [SRC]        SRC: a DeepGEMM source tree (default scratch/deepgemm)
#
# SRC holds DeepGEMM 2.6.1 (deepseek-ai/DeepGEMM 54e2261) with the include folders of its
# submodules in third-party/cutlass/include (NVIDIA/cutlass f3fde58) and
# third-party/fmt/include (fmtlib/fmt 553ec11). Put it in a git-ignored folder (scratch/
# is), e.g. from local clones:
#   git -C DeepGEMM archive 54e2261 | tar -x -C scratch/deepgemm
#   git -C cutlass archive f3fde58 include | tar -x -C scratch/deepgemm/third-party/cutlass
#   git -C fmt archive 553ec11 include | tar -x -C scratch/deepgemm/third-party/fmt
# and carry it to the device. Its code is never committed here.
#
# The system compiler builds it: the device's default CC (/opt/gcc) links libstdc++
# statically into the extension, which then crashes in its first iostream call. The
# extension is stripped of debug information and left in SRC/deep_gemm/ (about 2 MB
# instead of 20), so that it can come back through $OUT and be carried to later calls
# without a rebuild. Then:
#   export PYTHONPATH=$PWD/SRC:$PYTHONPATH DG_JIT_CACHE_DIR=$PWD/scratch/dg_jit
# and the benchmarks' `deepgemm` contenders import it (its kernels compile at first call;
# a carried DG_JIT_CACHE_DIR keeps them).
#
#   bash tools/build_deepgemm.sh --links [SRC]   only the include links its JIT needs: a tree
#                                                whose built extension was brought back and put
#                                                in place here lacks them (the build made them in
#                                                the device's copy); without them every kernel
#                                                fails with "NVCC compilation failed"
set -euo pipefail
LINKS_ONLY=0
if [ "${1:-}" = "--links" ]; then LINKS_ONLY=1; shift; fi
SRC="$(realpath "${1:-scratch/deepgemm}")"
[ -f "$SRC/setup.py" ] && [ -d "$SRC/third-party/cutlass/include/cute" ] || {
  echo "build_deepgemm: $SRC is not a DeepGEMM tree with its cutlass includes" >&2; exit 2; }
cd "$SRC"
# Relative links, so that the tree still works where it is carried to.
ln -sfn ../../third-party/cutlass/include/cutlass deep_gemm/include/cutlass
ln -sfn ../../third-party/cutlass/include/cute deep_gemm/include/cute
[ "$LINKS_ONLY" = 1 ] && { echo "build_deepgemm: include links made in $SRC"; exit 0; }
rm -rf build
CC=/usr/bin/gcc CXX=/usr/bin/g++ DG_USE_LOCAL_VERSION=0 MAX_JOBS="$(nproc)" \
  python3 setup.py build > build.log 2>&1 || { tail -20 build.log >&2; exit 1; }
so="$(find build -name '_C*.so' | head -1)"
strip --strip-debug -o "deep_gemm/$(basename "$so")" "$so"
cd - > /dev/null
PYTHONPATH="$SRC:${PYTHONPATH:-}" python3 -c \
  "import deep_gemm; print('build_deepgemm: deep_gemm', deep_gemm.__version__, 'in', '$SRC')"
