"""What every benchmark script shares: timing, the contender registry, checks and reports.

    env       the device the run is on (GPU or CPU), its description, versions
    timing    CUPTI kernel time (JAX), torch-profiler kernel time (torch peers),
              CPU wall clock; input sets rotated past the L2
    torch_glue  torch import and zero-copy array exchange with JAX
    registry  contenders: name, how inputs are prepared, the timed function,
              the contract it is checked against
    checks    float64 references and relative errors
    report    result rows, the table, ratios to peers, JSON, plot
    runner    the run: cases x contenders, JAX first, torch after, budgets
    cli       flags shared by the scripts, short usage errors

The benchmark definitions (cases, input sets, contenders) are in
benchmarks/workloads/; the scripts in benchmarks/ are thin mains.
"""
import os
import sys

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
# Run from a source checkout without installing: the repository root holds jax_fp8/.
# Appended, so that an explicit PYTHONPATH (e.g. the tree under test) still wins.
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:
  sys.path.append(_ROOT)
