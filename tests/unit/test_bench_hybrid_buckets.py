"""`bench hybrid --bucket-mb/--first-bucket-mb` reach our replica all-reduce's config."""

from __future__ import annotations

import pytest

from approxdist.benchmarks.hybrid import dp_config
from approxdist.benchmarks.pipeline import BenchCase
from approxdist.cli.main import main


def test_bucket_sizes_reach_the_replica_all_reduce_and_default_to_dp() -> None:
    case = BenchCase("mlp", (16,), 2, 2, "gpipe", replicas=2)
    default = dp_config(case)
    assert (default.bucket_mb, default.first_bucket_mb) == (1.0, 0.25)
    fine = dp_config(BenchCase("mlp", (16,), 2, 2, "gpipe", replicas=2, bucket_mb=0.1,
                               first_bucket_mb=0.05))
    assert (fine.bucket_mb, fine.first_bucket_mb) == (0.1, 0.05)


def test_a_negative_bucket_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "hybrid", "--bucket-mb", "-1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bucket sizes must be >= 0 MB" in err[0]
