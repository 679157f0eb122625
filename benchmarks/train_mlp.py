#!/usr/bin/env python3
"""Trains the same 2-layer MLP in FP8 (jax_fp8.nn.Linear) and in bf16 (flax.nnx.Linear).

A synthetic regression task: targets come from a fixed random "teacher" MLP plus
Gaussian noise, so the best reachable loss is about the noise variance. Both
students start from identical parameters, see identical batches and use the
same Adam; they differ only in their Linear class (both compute in bfloat16
with float32 parameters; the FP8 one quantises with DeepSeek-V3's recipe). The
script writes both loss curves (training loss per step, held-out loss every
--eval_every steps) to JSON and, where matplotlib is installed, a PNG.

  python benchmarks/train_mlp.py                     # CPU: well under a minute
  python benchmarks/train_mlp.py --steps=1000 --hidden=1024 --png_out=/tmp/mlp.png

Needs flax (pip install '.[flax]'); the PNG needs matplotlib (pip install '.[plot]').
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


@dataclasses.dataclass(frozen=True)
class Config:
  steps: int = 500
  batch: int = 256
  in_features: int = 256
  hidden: int = 512
  out_features: int = 64
  train_size: int = 32768
  eval_size: int = 2048
  noise: float = 0.1            # std of the targets' noise: the loss floor is noise**2
  learning_rate: float = 1e-3
  eval_every: int = 25
  seed: int = 0


def make_data(cfg: Config):
  """(x_train, y_train, x_eval, y_eval) from a random teacher MLP plus noise."""
  rng = np.random.default_rng(cfg.seed)
  w1 = rng.standard_normal((cfg.in_features, cfg.hidden)) / np.sqrt(cfg.in_features)
  w2 = rng.standard_normal((cfg.hidden, cfg.out_features)) / np.sqrt(cfg.hidden)

  def sample(n):
    x = rng.standard_normal((n, cfg.in_features))
    y = np.tanh(x @ w1) @ w2 + cfg.noise * rng.standard_normal((n, cfg.out_features))
    return jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32)
  return (*sample(cfg.train_size), *sample(cfg.eval_size))


def make_model(linear_cls, cfg: Config):
  """Linear -> gelu -> Linear, computing in bfloat16 with float32 parameters."""
  from flax import nnx

  class MLP(nnx.Module):
    def __init__(self, rngs):
      self.up = linear_cls(cfg.in_features, cfg.hidden, dtype=jnp.bfloat16, rngs=rngs)
      self.down = linear_cls(cfg.hidden, cfg.out_features, dtype=jnp.bfloat16, rngs=rngs)

    def __call__(self, x):
      return self.down(jax.nn.gelu(self.up(x)))
  return MLP(nnx.Rngs(cfg.seed))


def train(linear_cls, cfg: Config, data) -> dict:
  """Adam on the mean squared error; returns the loss curves and the time taken."""
  from flax import nnx
  x_train, y_train, x_eval, y_eval = data
  graphdef, params = nnx.split(make_model(linear_cls, cfg))

  def loss_fn(params, x, y):
    out = nnx.merge(graphdef, params)(x)
    return jnp.mean((out.astype(jnp.float32) - y) ** 2)

  b1, b2, eps = 0.9, 0.999, 1e-8

  @jax.jit
  def step(params, moments, t, idx):
    loss, grads = jax.value_and_grad(loss_fn)(params, x_train[idx], y_train[idx])
    m, v = moments
    m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, m, grads)
    v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, v, grads)
    lr = cfg.learning_rate * jnp.sqrt(1 - b2 ** t) / (1 - b1 ** t)
    params = jax.tree.map(lambda p, m, v: p - lr * m / (jnp.sqrt(v) + eps), params, m, v)
    return params, (m, v), loss

  eval_loss = jax.jit(lambda params: loss_fn(params, x_eval, y_eval))
  zeros = jax.tree.map(jnp.zeros_like, params)
  moments = (zeros, zeros)
  order = np.random.default_rng(cfg.seed + 1)
  train_curve, eval_steps, eval_curve = [], [], []
  start = time.perf_counter()
  for t in range(1, cfg.steps + 1):
    idx = jnp.asarray(order.integers(0, cfg.train_size, cfg.batch))
    params, moments, loss = step(params, moments, jnp.float32(t), idx)
    train_curve.append(float(loss))
    if t % cfg.eval_every == 0 or t == cfg.steps:
      eval_steps.append(t)
      eval_curve.append(float(eval_loss(params)))
  return dict(train_loss=train_curve, eval_steps=eval_steps, eval_loss=eval_curve,
              final_eval_loss=eval_curve[-1], seconds=time.perf_counter() - start)


def compare(cfg: Config) -> dict:
  """Both models on the same data; the FP8 one's final held-out loss relative to bf16's."""
  from flax import nnx
  import jax_fp8.nn
  data = make_data(cfg)
  fp8 = train(jax_fp8.nn.Linear, cfg, data)
  bf16 = train(nnx.Linear, cfg, data)
  return dict(config=dataclasses.asdict(cfg), device=str(jax.devices()[0]),
              jax_version=jax.__version__, fp8=fp8, bf16=bf16,
              noise_floor=cfg.noise ** 2,
              fp8_over_bf16=fp8["final_eval_loss"] / bf16["final_eval_loss"])


def plot(result: dict, path: str, log=print) -> bool:
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    log(f"matplotlib is not installed: no PNG written to {path} "
        "(pip install '.[plot]' or pip install matplotlib)")
    return False
  fig, ax = plt.subplots(figsize=(8, 5))
  for name, color in (("bf16", "tab:blue"), ("fp8", "tab:orange")):
    r = result[name]
    label = "bf16 (flax.nnx.Linear)" if name == "bf16" else "FP8 (jax_fp8.nn.Linear)"
    ax.plot(range(1, len(r["train_loss"]) + 1), r["train_loss"], color=color, alpha=0.35,
            linewidth=0.8)
    ax.plot(r["eval_steps"], r["eval_loss"], color=color, marker="o", markersize=3,
            label=f"{label}: held-out {r['final_eval_loss']:.4g}")
  ax.axhline(result["noise_floor"], color="gray", linestyle="--", linewidth=0.8,
             label="noise floor")
  ax.set_yscale("log")
  ax.set_xlabel("step")
  ax.set_ylabel("mean squared error (faint: training batches; dots: held-out)")
  cfg = result["config"]
  ax.set_title(f"2-layer MLP {cfg['in_features']}-{cfg['hidden']}-{cfg['out_features']}, "
               f"batch {cfg['batch']}: FP8/bf16 final loss = {result['fp8_over_bf16']:.3f}")
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return True


FLAGS = flags.FLAGS


def define_flags():
  d = Config()
  flags.DEFINE_integer("steps", d.steps, "training steps")
  flags.DEFINE_integer("batch", d.batch, "examples per step")
  flags.DEFINE_integer("in_features", d.in_features, "input width")
  flags.DEFINE_integer("hidden", d.hidden, "hidden width")
  flags.DEFINE_integer("out_features", d.out_features, "output width")
  flags.DEFINE_integer("train_size", d.train_size, "training examples")
  flags.DEFINE_integer("eval_size", d.eval_size, "held-out examples")
  flags.DEFINE_float("learning_rate", d.learning_rate, "Adam's learning rate")
  flags.DEFINE_integer("eval_every", d.eval_every, "held-out loss every this many steps")
  flags.DEFINE_integer("seed", d.seed, "seed of the data, the initialisation and the batches")
  flags.DEFINE_string("json_out", os.path.join(HERE, "train_mlp.json"), "write results here")
  flags.DEFINE_string("png_out", os.path.join(HERE, "train_mlp.png"),
                      "write the loss curves here (needs matplotlib; empty: no plot)")


def main(argv):
  del argv
  cfg = Config(steps=FLAGS.steps, batch=FLAGS.batch, in_features=FLAGS.in_features,
               hidden=FLAGS.hidden, out_features=FLAGS.out_features,
               train_size=FLAGS.train_size, eval_size=FLAGS.eval_size,
               learning_rate=FLAGS.learning_rate, eval_every=FLAGS.eval_every, seed=FLAGS.seed)
  result = compare(cfg)
  for name in ("fp8", "bf16"):
    r = result[name]
    print(f"{name:5s} final held-out loss {r['final_eval_loss']:.5f} "
          f"(last training batch {r['train_loss'][-1]:.5f}), {r['seconds']:.1f} s")
  print(f"FP8 / bf16 final held-out loss: {result['fp8_over_bf16']:.4f} "
        f"(noise floor {result['noise_floor']:.4f}; device {result['device']})")
  if FLAGS.json_out:
    with open(FLAGS.json_out, "w") as f:
      json.dump(result, f, indent=1)
    print(f"wrote {FLAGS.json_out}")
  if FLAGS.png_out and plot(result, FLAGS.png_out):
    print(f"wrote {FLAGS.png_out}")


if __name__ == "__main__":
  define_flags()
  app.run(main)
