"""Differential testing of the compile flows: random graphs, ONNX node tests, resource checks.

- :mod:`.graphs`: random DAGs of memory-intensive ONNX ops (and a Hypothesis strategy).
- :mod:`.choices`: the random, replayed or Hypothesis-driven choices behind them, and a shrinker.
- :mod:`.differential`: compile one model with a flow, run it on the SIMT runner, compare with
  onnxruntime and classify the outcome (ok, mismatch, crash, TVM's crash; fallbacks; resource
  violations).
- :mod:`.resources`: per-kernel limits (threads, shared memory, registers, spills, local
  memory, one wave for grid barriers) from ``nvcc -Xptxas -v`` for sm_80 and sm_90.
- :mod:`.fuzz`: the loop of ``scripts/fuzz.py`` (worker process, shrinking, regression cases).
- :mod:`.node`: ONNX's backend node tests for the ops the flows accept
  (``python -m tvm_stitch.testing.node``).

Hypothesis is needed only for :func:`.graphs.graphs` (the ``test`` extra).
"""
