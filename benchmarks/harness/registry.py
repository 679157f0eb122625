"""Contenders: what runs, on what inputs, checked against what.

A workload (benchmarks/workloads/*.py) registers each contender once, by name:

    REGISTRY = registry.Registry()

    @REGISTRY.add("bf16", "XLA bf16 dot of the dequantised operands")
    def _bf16(case, opts, env) -> registry.Contender:
      ...

The factory is called per case and returns a `Contender` (or raises
`Unavailable` / `Skipped` with the reason the table shows). Contenders use
jax_fp8's public API only (the package's functions, jax_fp8.backends' names,
jax_fp8.testing), so a benchmark measures what users call.
"""
from __future__ import annotations

import dataclasses
from typing import Callable


class Unavailable(Exception):
  """This contender cannot run here (the reason is shown in the table)."""


class Skipped(Unavailable):
  """This contender could run, but not at this case under these flags."""


@dataclasses.dataclass
class Contender:
  """How one contender runs at one case: fn(*prepare(input_set)) is timed."""
  fn: Callable
  prepare: Callable                 # input set -> fn's arguments (not timed)
  contract: str = "default"         # which reference its output is checked against
  bound: float | None = None        # relative error bound; None: the error is only reported
  resolved: str | None = None       # the jax_fp8 backend that runs (for pallas / auto)
  interpret: bool = False           # run once in GPU interpret mode (correctness only)
  compiler_options: dict | None = None
  result: Callable | None = None    # fn's output -> what is compared (not timed)
  extra: dict = dataclasses.field(default_factory=dict)  # shown in the JSON row


@dataclasses.dataclass(frozen=True)
class Entry:
  name: str
  doc: str
  factory: Callable                 # (case, opts, env) -> Contender
  role: str = "peer"                # "backend": a jax_fp8 contender (its check sets the
                                    # exit status); "peer": what we compare against
  runtime: str = "jax"              # "jax" (CUPTI / CPU clock) or "torch" (after all JAX)
  applies: Callable | None = None   # case -> bool; None: every case
  in_all: bool = True               # part of --backends=all (aliases such as "auto" are not)


class Registry:
  """The contenders of one workload, in the order they were added."""

  def __init__(self):
    self._entries: dict[str, Entry] = {}

  def add(self, name: str, doc: str, *, role: str = "peer", runtime: str = "jax",
          applies: Callable | None = None, in_all: bool = True):
    if name in self._entries:
      raise ValueError(f"contender {name!r} registered twice")
    if role not in ("backend", "peer") or runtime not in ("jax", "torch"):
      raise ValueError(f"contender {name!r}: role {role!r} / runtime {runtime!r}")

    def register(factory):
      self._entries[name] = Entry(name, doc, factory, role, runtime, applies, in_all)
      return factory
    return register

  def __contains__(self, name) -> bool:
    return name in self._entries

  def __getitem__(self, name) -> Entry:
    return self._entries[name]

  def names(self) -> tuple[str, ...]:
    return tuple(self._entries)

  def all(self) -> tuple[str, ...]:
    """--backends=all: every contender but the aliases, backends first, then peers."""
    chosen = [n for n, e in self._entries.items() if e.in_all]
    return tuple(sorted(chosen, key=lambda n: self._entries[n].role != "backend"))

  def peers(self) -> tuple[str, ...]:
    return tuple(n for n, e in self._entries.items() if e.role == "peer")

  def applies(self, name, case) -> bool:
    entry = self._entries[name]
    return entry.applies is None or bool(entry.applies(case))

  def help(self, indent="  ") -> str:
    width = max(len(n) for n in self._entries)
    return "\n".join(f"{indent}{n:<{width}}  {e.doc}" for n, e in self._entries.items())
