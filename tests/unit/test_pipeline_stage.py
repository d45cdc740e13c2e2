"""One stage's compute in one process: recomputation (GPipe) against stored activations, memory,
the forward-only action filter, a one-stage pipeline against the oracle, and config checks."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from approxdist.comm.codecs import get_codec
from approxdist.config.loader import load_config
from approxdist.config.pipeline import PipelineConfig
from approxdist.config.wire import Wire
from approxdist.errors import ConfigError
from approxdist.launch.context import DistContext
from approxdist.pipeline.errors import PipelineError
from approxdist.pipeline.executor import forward_only
from approxdist.pipeline.microbatch import split_microbatches
from approxdist.pipeline.runtime import build_runtime, check_run
from approxdist.pipeline.schedule import Kind, build_schedule
from approxdist.pipeline.stage import StageCompute
from approxdist.pipeline.transport import _Direction
from approxdist.train.check import check_parts


def _bn_dropout_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Sequential(nn.Linear(6, 32), nn.BatchNorm1d(32), nn.ReLU()),
                         nn.Sequential(nn.Dropout(0.3), nn.Linear(32, 32), nn.ReLU()),
                         nn.Linear(32, 3))


def _gpipe_order(compute: StageCompute, x: torch.Tensor, y: torch.Tensor, m: int) -> None:
    mbs = split_microbatches(x, y, m)
    torch.manual_seed(5)
    for mb in mbs:
        compute.forward(mb.index, mb.inputs, mb.labels, mb.weight)
    for mb in mbs:
        compute.backward(mb.index, None)


def test_recompute_gives_identical_gradients_and_batchnorm_stats_with_less_memory() -> None:
    x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))
    runs = {}
    for recompute in (False, True):
        model = _bn_dropout_model()
        compute = StageCompute(model, is_first=True, is_last=True, loss_fn=F.cross_entropy,
                               recompute=recompute)
        _gpipe_order(compute, x, y, 4)
        runs[recompute] = (model, compute)
    (stored, c_stored), (recomputed, c_re) = runs[False], runs[True]
    for (name, a), b in zip(stored.named_parameters(), recomputed.parameters()):
        assert a.grad is not None and b.grad is not None
        torch.testing.assert_close(b.grad, a.grad, atol=1e-6, rtol=0, msg=name)
    for (name, buf), other in zip(stored.named_buffers(), recomputed.buffers()):
        assert torch.equal(buf, other), f"batch-norm buffer {name} changed by recomputation"
    assert float(c_re.loss_sum) == pytest.approx(float(c_stored.loss_sum))
    assert 0 < c_re.memory.peak < c_stored.memory.peak / 2
    assert c_re.memory.live == c_stored.memory.live == 0 and c_re.in_flight == 0


def test_forward_only_keeps_the_forward_actions_in_order() -> None:
    order = build_schedule("1f1b", 3, 4)
    for rank, actions in order.items():
        kept = forward_only(actions)
        assert [a for a in actions if a.kind in (Kind.FORWARD, Kind.SEND_ACT, Kind.RECV_ACT)] \
            == kept
        assert [a.microbatch for a in kept if a.kind == Kind.FORWARD] == list(range(4)), rank


def test_one_stage_pipeline_matches_the_oracle() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 2))
    reference = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 2))
    reference.load_state_dict(model.state_dict())
    x, y = torch.randn(10, 5), torch.randint(0, 2, (10,))
    rt = build_runtime(PipelineConfig(stages=1, microbatches=3), model, DistContext(), x[:2])
    res = rt.executor.train_step(x, y, 10)
    total = 0.0
    for mb in split_microbatches(x, y, 3):
        loss = F.cross_entropy(reference(mb.inputs), mb.labels) * mb.weight
        loss.backward()
        total += float(loss.detach())
    assert res.loss == pytest.approx(total, abs=1e-6) and res.samples == 10
    for a, b in zip(model.parameters(), reference.parameters()):
        assert a.grad is not None and b.grad is not None
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=0)
    assert res.times.compute_s > 0 and res.peak_activation_bytes > 0
    rt.close()


def test_a_direction_codes_into_its_buffers_as_its_codec_does_and_counts_the_time() -> None:
    d, codec = _Direction.build(Wire(codec="bits:s0e2+2m0"), seed=0), get_codec("bits:s0e2+2m0")
    x = torch.rand(4, 25)
    buf = torch.empty(codec.payload_nbytes(100), dtype=torch.uint8)
    payload = d.encode(x, buf)
    assert payload.data.data_ptr() == buf.data_ptr()  # encoded in place
    assert torch.equal(payload.data, codec.encode(x).data)
    out = torch.empty(4, 25)
    assert d.decode(payload, out).data_ptr() == out.data_ptr()
    assert torch.equal(out, codec.decode(codec.encode(x)))
    assert d.encode_s > 0 and d.decode_s > 0


@pytest.mark.parametrize("section, message", [
    ({"stages": 0}, "pipeline.stages = 0 must be >= 1"),
    ({"microbatches": 0}, "pipeline.microbatches = 0 must be >= 1"),
    ({"schedule": "zb"}, "pipeline.schedule = 'zb' is not one of: 1f1b, gpipe"),
    ({"split": "3,x"}, "pipeline.split = '3,x' is not a comma-separated list"),
    ({"split": "5,2"}, "must be increasing block indices"),
    ({"split": "2", "balance": "time"}, "give one of them, not both"),
    ({"balance": "flops"}, "pipeline.balance = 'flops' is not one of: params, time"),
    ({"wire": {"fwd": {"codec": "bits:s2"}}}, "wire.fwd.codec = 'bits:s2': unknown codec spec"),
    ({"wire": {"bwd": {"channel": "ber:2@1"}}},
     "wire.bwd.channel = 'ber:2@1': bit error rate 2.0"),
])
def test_bad_pipeline_config_names_the_value(section: dict[str, object], message: str) -> None:
    """Ranges and syntax fail in the config; names (schedule, codecs) in `check_parts`."""
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        wire = section.pop("wire", {})
        check_parts(load_config(None, {"train": {"parallel": "pipeline"}, "pipeline": section,
                                       "wire": wire}))


def test_config_defaults_and_balance() -> None:
    cfg = load_config(None, {"train": {"parallel": "pipeline", "world_size": 3},
                             "data": {"batch_size": 64}})  # 64 % 3 != 0 is fine here
    assert cfg.pipeline.balance_method == "params" and cfg.pipeline.schedule == "gpipe"
    assert PipelineConfig(split="3").balance_method is None


@pytest.mark.parametrize("kwargs, blocks, batch, message", [
    ({"stages": 5}, 4, 64, r"5 stages for a model of 4 blocks; use 1..4 stages"),
    ({"stages": 2, "split": "9"}, 4, 64, r"split index 9 out of range for a model of 4 "
                                            r"blocks; valid boundaries are 1..3"),
    ({"stages": 3, "split": "2"}, 4, 64, r"split '2' makes 2 stages but pipeline.stages is 3"),
    ({"stages": 2, "microbatches": 80}, 4, 64, r"micro-batches \(80\) exceed the batch size "
                                                  r"\(64\); use 1..64"),
])
def test_run_cross_checks(kwargs: dict[str, object], blocks: int, batch: int,
                          message: str) -> None:
    with pytest.raises(PipelineError, match=message):
        check_run(PipelineConfig(**kwargs), blocks, batch)
