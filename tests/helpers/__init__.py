"""Test fixtures that are not the product: a simulated world of ranks, a schedule's trace
on paper, a small traced pipeline (what users import lives in `src/approxdist`)."""
