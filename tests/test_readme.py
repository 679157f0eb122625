"""The README's Python examples run as written, in order, in one namespace (as a
reader pasting them into one session would), on the CPU: the reference backend
and the kernels in GPU interpret mode. After some blocks, what their comments
promise (shapes, dtypes, zero rows) is checked. About a minute on two cores."""
import json
import os
import re
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")

# Run after the block of that number (1-based), in the examples' namespace.
CHECKS = {
    1: """
       assert y.shape == (4096, 2112) and y.dtype == jnp.float32, (y.shape, y.dtype)
       assert bool(jnp.isfinite(y).all())
       """,
    3: """
       assert y.shape == (1, 4096, 2112) and y.dtype == jnp.float32, (y.shape, y.dtype)
       """,
    4: """
       assert y.shape == (4096, 2816) and y.dtype == jnp.bfloat16, (y.shape, y.dtype)
       """,
    7: """
       shapes = (q.shape, s.shape, q_t.shape, s_t.shape)
       assert shapes == ((4096, 7168), (4096, 56), (7168, 4096), (7168, 32)), shapes
       assert q.dtype == q_t.dtype == jnp.float8_e4m3fn
       """,
    8: """
       # y is the second call's: the group sizes then sum to 850.
       assert y.shape == (1000, 512) and y.dtype == jnp.bfloat16, (y.shape, y.dtype)
       assert int(group_sizes.sum()) - 50 == 850
       assert not bool(jnp.any(y[850:])) and bool(jnp.any(y[:850]))
       assert z.shape == (8, 64, 512) and z.dtype == jnp.float32, (z.shape, z.dtype)
       rows = jnp.arange(64)[None, :, None] < masked_m[:, None, None]
       assert not bool(jnp.any(jnp.where(rows, 0, z))) and bool(jnp.all(jnp.isfinite(z)))
       assert zl.shape == (8, 1024, 512), zl.shape
       """,
    9: """
       assert y.shape == (8, 512, 2048) and y.dtype == jnp.bfloat16, (y.shape, y.dtype)
       assert dx.shape == x.shape and dx.dtype == jnp.bfloat16, (dx.shape, dx.dtype)
       assert dkernel.shape == (1024, 2048) and dkernel.dtype == jnp.float32
       assert bool(jnp.any(dkernel != 0))
       """,
    10: """
       assert (qh.shape, qh.dtype, sh.shape) == ((4096, 18432), jnp.float8_e4m3fn, (4096, 144))
       assert y.shape == (4096, 7168) and y.dtype == jnp.bfloat16, (y.shape, y.dtype)
       assert (qy.shape, qy.dtype, sy.shape) == ((4096, 7168), jnp.float8_e4m3fn, (4096, 56))
       """,
}

# Runs in its own process: eight CPU devices (the sharding examples), no GPU.
RUNNER = r"""
import json, re, sys
readme, checks = sys.argv[1], {int(i): code for i, code in json.loads(sys.argv[2]).items()}
blocks = re.findall(r"```python\n(.*?)```", open(readme).read(), re.S)
ns = {}
for i, block in enumerate(blocks, 1):
  exec(compile(block, f"README.md, Python example {i}", "exec"), ns)
  if i in checks:
    exec(compile(checks[i], f"the check after README example {i}", "exec"), ns)
print("ran", len(blocks), "examples")
"""


def test_readme_examples_run_as_written():
  n = len(re.findall(r"```python\n", open(README).read()))
  assert n >= max(CHECKS), f"the README has {n} Python examples; CHECKS names {max(CHECKS)}"
  checks = {i: textwrap.dedent(code) for i, code in CHECKS.items()}
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS="--xla_force_host_platform_device_count=8")
  done = subprocess.run([sys.executable, "-c", RUNNER, README, json.dumps(checks)], cwd=ROOT,
                        env=env, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-4000:]
  assert f"ran {n} examples" in done.stdout
