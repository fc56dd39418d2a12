"""Throughput of lmtune's real training step against a naive baseline (the command: python -m lmtune.bench).

The optimized step is exactly the one training runs (``loops.OptimizedLoop``): ``TrainState.create``,
``Runtime.build`` (compile when ``should_compile`` says so, or as ``--compile`` forces; bf16 autocast where
the config's precision enables it) and ``train_step``, with batches prefetched by ``DeviceBatches`` and no
host sync on GPU. The naive baseline (``loops.NaiveLoop``) is the loop most first implementations start
from. ``benchmark.run_bench`` times both in the same process, repeats interleaved, after warm-up (and
compilation), synchronized on CUDA, and reports the median over repeats (``results.BenchResult``);
``machine`` says what it ran on. ``concurrency.run_concurrency`` instead runs K worker processes at once
(as fractional-GPU trials do) and measures aggregate tokens/s and per-process memory for each K;
lmtune.sweep.placement turns such measurements into the sweep's packing.
"""
