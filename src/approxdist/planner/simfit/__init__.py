"""Fitting `simulate`'s unmeasured inputs to observed speed-ups, and time to accuracy at scale."""
