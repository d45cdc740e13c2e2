"""Hybrid pipeline x data parallelism (PipeDream; seed 002): replicated pipeline stages.

`build_hybrid_runtime` assembles one rank's stage: the pipeline runtime on the pipeline
group (every rank, stage-major), micro-batches dealt round robin to each stage's
replicas (`topology.dealing`, `pipeline.schedule.replicated`), and a `DataParallel`
over the stage's replica group that sums the replicas' gradients during the last
micro-batch's backward (seed 002's `_sync`); `mean_loss`, a step's mean loss over a
replicated last stage. docs/hybrid.md.
"""

from approxdist.hybrid.runtime import build_hybrid_runtime

__all__ = ["build_hybrid_runtime"]
