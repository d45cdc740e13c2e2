"""The benchmarks of `approxdist bench`: one module per command, each against a named baseline.

* `allreduce`: every all-reduce algorithm and codec against `native` (seed 001);
* `p2p`: one message through our link against gloo's own send/recv;
* `dp`: our data-parallel step against torch DDP;
* `pipeline`: our pipeline runtime against `torch.distributed.pipelining`;
* `hybrid`: our hybrid runtime against torch's stages + `replicate`;
* `tp`: our tensor parallelism against `torch.distributed.tensor.parallel` (`tp_torch`),
  and each wire format against our fp32 wire;
* `codec`: every codec's encode/decode against memory copy and the fp16 cast (one process);
* `trace`: a recorder span against a bare `with` (one process).

Each returns rows (the distributed ones measure on every rank, through
`launch.spawn.run_on_ranks`); the `cli/bench_*.py` commands print them. They sit above
the layers they measure, so no algorithm layer holds benchmark code; what every
benchmark shares is `bench/`, below all.
"""
