"""Timeline analysis of a merged trace (seed 002): bottleneck figures, report and chart.

    from approxdist.analysis import analyze
    figures = analyze(trace, stages=4, microbatches=8)

What `approxdist analyze RUN_DIR` reads (docs/tracing.md). The recorder that writes the
trace is `approxdist.trace`, a layer below every engine; this package sits above them
(it knows the pipeline schedules' theoretical bubble). `chart` (matplotlib) is not
imported here.
"""

from approxdist.analysis.bottleneck import Analysis, BubbleFigures, LinkFigures, RankFigures, analyze
from approxdist.analysis.report import RunInfo, congestion, format_report, report_dict

__all__ = ["Analysis", "BubbleFigures", "LinkFigures", "RankFigures", "RunInfo", "analyze",
           "congestion", "format_report", "report_dict"]
