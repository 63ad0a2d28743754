"""model.precision: what ``auto`` picks, bf16 autocast with fp32 weights and optimizer state,
a click probability that stays fp32, and the pass log saying which ran."""

from __future__ import annotations

import json

import pytest
import torch
from streamrec.control.trainer_config import TrainerConfig
from streamrec.trainer.model.dlrm import DLRMDense
from streamrec.trainer.model.precision import compute_in, cpu_flags, resolve
from streamrec.trainer.runner import OnlineTrainer
from trainer_helpers import small_config

CPU = torch.device("cpu")


def test_auto_picks_bf16_only_on_a_cpu_with_fast_bf16():
    assert resolve("auto", CPU, {"avx2", "avx512f"}).name == "fp32"
    assert resolve("auto", CPU, {"avx512f", "avx512_bf16"}).name == "bf16"
    amx = resolve("auto", CPU, {"amx_bf16", "amx_tile"})
    assert amx.name == "bf16" and "amx_bf16" in amx.reason
    assert resolve("bf16", CPU, set()).name == "bf16"  # asked for: run even where slow
    assert resolve("fp32", CPU, {"amx_bf16"}).name == "fp32"
    with pytest.raises(ValueError, match="'fp16'"):
        resolve("fp16", CPU)


def test_cpu_flags_reads_the_flags_line(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx512_bf16 sse\n\nprocessor\t: 1\n")
    assert cpu_flags(info) == {"fpu", "avx512_bf16", "sse"}
    assert cpu_flags(tmp_path / "absent") == set()


def test_precision_is_set_in_the_model_section_or_as_the_rest_jobs_model_precision():
    assert TrainerConfig.parse({}).hyper_parameters.precision == "auto"
    assert TrainerConfig.parse({"precision": "bf16"}).hyper_parameters.precision == "bf16"
    hp = {"hyper_parameters": {"precision": "fp32"}}
    assert TrainerConfig.parse(hp).hyper_parameters.precision == "fp32"
    with pytest.raises(ValueError, match="contradicts"):
        TrainerConfig.parse({"precision": "bf16", **hp})
    with pytest.raises(ValueError, match="precision"):
        TrainerConfig.parse({"precision": "fp8"})


def test_bf16_autocast_keeps_fp32_weights_grads_and_a_fp32_probability_close_to_fp32s():
    torch.manual_seed(0)
    model = DLRMDense(13, 4, 8, [13, 32, 8], [16, 1])
    x, ly = torch.randn(256, 13), torch.randn(256, 4, 8)
    exact = model(x, ly)
    with compute_in(resolve("bf16", CPU), CPU):
        p = model(x, ly)
    assert p.dtype == torch.float32  # the sigmoid runs in fp32 (no p rounded to 1)
    assert torch.allclose(p, exact, atol=0.02), (p - exact).abs().max()
    assert not torch.equal(p, exact)  # bf16 did run
    p.sum().backward()
    assert all(t.dtype == torch.float32 for t in model.parameters())
    assert all(t.grad is not None and t.grad.dtype == torch.float32 for t in model.parameters())
    with compute_in(resolve("fp32", CPU), CPU):
        assert torch.equal(model(x, ly), exact)  # fp32: the model as it always was


def test_under_bf16_the_dense_inputs_layer_and_the_interaction_stay_fp32():
    """What bf16 costs in AUC comes from two places (BENCHMARKS.md): the raw dense features
    (bf16 merges log1p(1990) and log1p(1995)) and the interaction (the embeddings'
    gradients); both stay fp32, the MLPs' other layers run in bf16."""
    model = DLRMDense(13, 4, 8, [13, 32, 8], [16, 1])
    seen: dict[str, torch.dtype] = {}
    for name in ("bot_l.0", "bot_l.2", "top_l.0"):
        layer = model.get_submodule(name)
        layer.register_forward_hook(lambda _m, _i, out, name=name: seen.update({name: out.dtype}))
    interact = model.interact

    def spy(x, ly):
        out = interact(x, ly)
        seen["interaction"] = out.dtype
        return out

    model.interact = spy  # type: ignore[method-assign]
    with compute_in(resolve("bf16", CPU), CPU):
        model(torch.randn(8, 13), torch.randn(8, 4, 8))
    assert seen == {
        "bot_l.0": torch.float32,
        "bot_l.2": torch.bfloat16,
        "interaction": torch.float32,
        "top_l.0": torch.bfloat16,
    }


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_pass_record_says_which_precision_ran(stream, tmp_path, precision):
    cfg = small_config(stream, tmp_path / "m", end_day="20190720")
    cfg = TrainerConfig.parse(
        cfg.model_dump(mode="json")
        | {"hyper_parameters": cfg.hyper_parameters.model_dump() | {"precision": precision}}
    )
    trainer = OnlineTrainer(cfg)
    try:
        trainer.run()
    finally:
        trainer.close()
    lines = (tmp_path / "m" / "passes.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert records and all(r["precision"] == precision for r in records)
    assert all(r["predict_auc"] is None or 0.0 <= r["predict_auc"] <= 1.0 for r in records)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_cuda_gpu_auto_trains_the_dense_model_in_bf16_with_fp32_weights(stream, tmp_path):
    base = small_config(stream, tmp_path / "m", end_day="20190720").model_dump(mode="json")
    cfg = TrainerConfig.parse(base | {"distributed": {"backend": "nccl"}})  # world 1: cuda
    trainer = OnlineTrainer(cfg)
    try:
        assert trainer.device.type == "cuda" and trainer.precision.name == "bf16"
        trainer.run()
        assert all(p.is_cuda and p.dtype == torch.float32 for p in trainer.dense.parameters())
    finally:
        trainer.close()
    lines = (tmp_path / "m" / "passes.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert records and all(r["precision"] == "bf16" for r in records)
    assert records[-1]["train_auc"] > 0.55  # it learns the planted stream (0.65 on a CPU)
