"""Process launching: the per-rank context, local elastic launch and the N-rank spawn helper."""
