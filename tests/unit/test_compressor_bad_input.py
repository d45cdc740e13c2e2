"""Bad compressor input on `approxdist train`: one line naming the value and a fix, exit 2,
before any worker starts (docs/compressors.md, "Bad input")."""

from __future__ import annotations

from pathlib import Path

import pytest

from approxdist.cli.main import main

DP = ["train", "--world-size", "2", "--model", "mlp", "--epochs", "1"]
HYBRID = ["train", "--parallel", "hybrid", "--stages", "2", "--replicas", "2", "--model", "mlp",
          "--epochs", "1"]
PS = ["train", "--parallel", "ps", "--servers", "1", "--workers", "2", "--model", "mlp",
      "--epochs", "1"]
CASES = [
    (DP + ["--codec", "topk:2"], "topk ratio '2': it needs a fraction in (0, 1]"),
    (DP + ["--codec", "powersgd:0"], "powersgd rank '0' must be a positive integer"),
    (DP + ["--codec", "qsgd:1"], "qsgd levels '1' must be an integer in [2, 32768]"),
    (DP + ["--codec", "lowrank:2"], "unknown codec spec 'lowrank:2'; valid forms: fp32 | "),
    (DP + ["--codec", "lowrank:2"], "; or a compressor: powersgd:<r>, qsgd:<s>, randomk:<ratio>,"),
    (DP + ["--codec-rule", "*.weight=topk:2"], "wire.grad.rules = '*.weight=topk:2': topk ratio"),
    (DP + ["--codec", "powersgd:2"], "cannot compress '0.1.bias' of shape (256,)"),
    (DP + ["--codec", "signsgd", "--algorithm", "brb"],
     "signsgd needs all-gather (its workers' messages do not sum), and the all-reduce "
     "algorithm 'brb' only sums; use --algorithm ring or auto"),
    (HYBRID + ["--codec", "topk:0.1", "--algorithm", "vhd"], "'vhd' only sums"),
    (HYBRID + ["--codec", "powersgd:2"], "PowerSGD needs a matrix"),
    (PS + ["--codec", "powersgd:2"],
     "wire.push.codec = 'powersgd:2': PowerSGD needs a second round trip each step"),
    (PS + ["--codec", "topk:0.1", "--push-channel", "ber:1e-3@5"],
     "wire.push.codec = 'topk:0.1': a compressor with a push channel"),
    (PS + ["--codec", "topk:3"], "wire.push.codec = 'topk:3': topk ratio '3'"),
    (PS + ["--pull-codec", "signsgd"],
     "wire.pull.codec = 'signsgd': compressors travel on gradient wires"),
]


@pytest.mark.parametrize("argv,words", CASES, ids=[f"{i} {c[0][-1]}" for i, c in enumerate(CASES)])
def test_one_line_exit_2_before_any_worker(argv: list[str], words: str, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and words in err, err
    assert not (out / "workers").exists()


def test_bench_labels_keep_a_compressor_whose_name_ends_in_ef() -> None:
    """`sign+ef` is one compressor, not `sign` with error feedback (the documented
    `bench dp --codec ...,sign+ef,...` once failed with "unknown codec spec 'sign'")."""
    from approxdist.benchmarks.dp import codec_label, split_label
    from approxdist.errors import ConfigError

    assert split_label("sign+ef") == ("sign+ef", False) and codec_label("sign+ef") == "sign+ef"
    assert split_label("bits:s0e2+2m0+ef") == ("bits:s0e2+2m0", True)
    assert codec_label("fp8-e5m2+ef") == "fp8-e5m2+ef"
    with pytest.raises(ConfigError, match="keeps its own residual"):
        codec_label("topk:0.01+ef")
