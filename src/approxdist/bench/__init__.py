"""What every `approxdist bench` shares: timing, statistics, the host's steal, tables, JSON.

Benchmarks measure their baseline in the same run, interleaved, and print medians and
ratios (STYLE.md 12). The measurement code of each benchmark is in `benchmarks/`, one
module per command, above the layers it measures; the pieces they all need live here
once, below every layer (this package imports nothing else of approxdist):

* `stats`: medians, the 10th percentile, paired ratios, slowest / fastest rank per step;
* `timing`: one timed call, a call repeated, and rounds of interleaved variants;
* `host`: the share of CPU time the hypervisor stole during the run;
* `report`: fixed-width tables, the closing lines (host, reproduce) and `--json` rows.
"""
