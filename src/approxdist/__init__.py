"""approxdist: distributed training where what crosses the network is tunable and measured."""

__version__ = "0.1.0"
