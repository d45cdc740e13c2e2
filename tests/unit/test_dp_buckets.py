"""Bucket planning and fragments (pure, seed 001): order, caps, codecs, solo parameters."""

from __future__ import annotations

import pytest

from approxdist.config.dp import check_sizes
from approxdist.data_parallel.buckets import ParamInfo, forward_order, fragments, plan_buckets
from approxdist.errors import ConfigError


def _params(*numels: int, codecs: tuple[str, ...] = ()) -> list[ParamInfo]:
    return [ParamInfo(f"p{i}", n, codecs[i] if codecs else "fp32", i) for i, n in enumerate(numels)]


def test_buckets_follow_backward_order_and_lay_out_forward_order() -> None:
    plans = plan_buckets(_params(10, 10, 10, 10), bucket_bytes=80, first_bucket_bytes=40)
    assert [p.names for p in plans] == [("p3",), ("p1", "p2"), ("p0",)]
    assert plans[1].offsets == (0, 10) and plans[1].numel == 20
    assert forward_order(len(plans)) == [2, 1, 0]


def test_codec_change_closes_a_bucket() -> None:
    plans = plan_buckets(_params(1, 1, 1, codecs=("fp32", "bf16", "bf16")), bucket_bytes=1000)
    assert [(p.names, p.codec) for p in plans] == [(("p1", "p2"), "bf16"), (("p0",), "fp32")]


def test_solo_and_oversized_parameters_get_their_own_bucket() -> None:
    plans = plan_buckets(_params(2, 100, 2, 2), bucket_bytes=64, first_bucket_bytes=64,
                         solo_bytes=200)
    assert [p.names for p in plans] == [("p2", "p3"), ("p1",), ("p0",)]
    per_param = plan_buckets(_params(2, 2, 2), bucket_bytes=0, first_bucket_bytes=0)
    assert [p.names for p in per_param] == [("p2",), ("p1",), ("p0",)]


def test_fragments_cover_the_bucket_without_overlap() -> None:
    assert fragments(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert fragments(10, 0) == [(0, 10)]
    assert fragments(0, 4) == []


@pytest.mark.parametrize(("args", "message"), [
    ((-1.0, 1.0, 0.0, 1), "bucket sizes must be >= 0"),
    ((25.0, 1.0, -2.0, 1), "chunk_kb = -2.0 must be >= 0"),
    ((25.0, 1.0, 0.0, 0), "threads = 0 must be >= 1"),
])
def test_bad_sizes_are_named(args: tuple[float, float, float, int], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        check_sizes(*args)


def test_an_all_gather_compressor_shares_its_bucket_with_exact_fp32() -> None:
    """top-k's matrices and the fp32 vectors between them: one bucket (one all-gather a
    step, `gathered_together`), where a bucket per matrix and per run of vectors made 5;
    another compressor closes the bucket."""
    infos = [ParamInfo("0.weight", 100, "topk:0.1", 0), ParamInfo("0.bias", 10, "fp32", 1),
             ParamInfo("1.weight", 100, "topk:0.1", 2), ParamInfo("1.bias", 10, "fp32", 3),
             ParamInfo("2.weight", 100, "qsgd:7", 4)]
    plans = plan_buckets(infos, bucket_bytes=1 << 20)
    assert [(p.names, p.codec) for p in plans] == [
        (("1.bias", "2.weight"), "qsgd:7"), (("0.weight", "0.bias", "1.weight"), "topk:0.1")]
    assert [plans[1].codec_of(i) for i in range(3)] == ["topk:0.1", "fp32", "topk:0.1"]
    assert [plans[0].codec_of(i) for i in range(2)] == ["fp32", "qsgd:7"]


def test_gpt_tiny_under_an_all_gather_compressor_is_bucketed_as_under_fp32() -> None:
    """`bench dp --model gpt-tiny --codec topk:0.01` (vectors in fp32, DataParallel's default
    caps): as many buckets as fp32's, where a bucket per matrix (11) and per run of vectors
    between them (10) made 21 collectives a step."""
    from approxdist.models.gpt import SIZES, gpt

    model = gpt(SIZES["gpt-tiny"], vocab=256, seq_len=64)
    for spec in ("topk:0.01", "fp32"):
        infos = [ParamInfo(n, p.numel(), spec if p.dim() > 1 else "fp32", i)
                 for i, (n, p) in enumerate(model.named_parameters())]
        plans = plan_buckets(infos, 1 << 20, 1 << 18, 1 << 20)
        assert len(plans) == 2, spec
        assert sum(len(p.names) for p in plans) == len(infos) == 29


def test_a_summed_compressor_shares_its_bucket_with_exact_fp32() -> None:
    """PowerSGD's matrices and the fp32 vectors between them: one bucket, as a DDP bucket
    under torch's powerSGD_hook; each member keeps its codec; bf16 closes the bucket."""
    infos = [ParamInfo("0.weight", 100, "powersgd:2", 0), ParamInfo("0.bias", 10, "fp32", 1),
             ParamInfo("1.weight", 100, "powersgd:2", 2), ParamInfo("1.bias", 10, "fp32", 3),
             ParamInfo("2.weight", 100, "bf16", 4)]
    plans = plan_buckets(infos, bucket_bytes=1 << 20)
    assert [(p.names, p.codec) for p in plans] == [
        (("2.weight",), "bf16"), (("0.weight", "0.bias", "1.weight", "1.bias"), "powersgd:2")]
    assert [plans[1].codec_of(i) for i in range(4)] == ["powersgd:2", "fp32", "powersgd:2", "fp32"]
    assert plans[0].codec_of(0) == "bf16"
    # the cap still closes it (4 bytes a value): 110 values, then 110
    capped = plan_buckets(infos[:4], bucket_bytes=440)
    assert [p.names for p in capped] == [("1.weight", "1.bias"), ("0.weight", "0.bias")]


def test_resnet20_under_powersgd_is_two_buckets_as_under_torchs_hook() -> None:
    """`bench dp --model resnet20 --codec powersgd:2` (vectors in fp32, DataParallel's
    default caps: first 0.25 MB, then 1 MB): 2 buckets, so 4 all-reduces a step (P, Q
    each), where a bucket per compressed parameter made 40 buckets and 60 all-reduces."""
    from approxdist.config.schema import ModelConfig
    from approxdist.models import build_model

    model = build_model(ModelConfig(name="resnet20"), (3, 32, 32), 10)
    infos = [ParamInfo(n, p.numel(), "powersgd:2" if p.dim() > 1 else "fp32", i)
             for i, (n, p) in enumerate(model.named_parameters())]
    plans = plan_buckets(infos, 1 << 20, 1 << 18, 1 << 20)
    assert [p.codec for p in plans] == ["powersgd:2", "powersgd:2"]
    assert sum(len(p.names) for p in plans) == len(infos) == 59
