"""runner.device (a REST job's model.device): the setting, the device it gives, the refusal of
cuda where there is no GPU (the trainer, the benchmarks), and a pass on a GPU against the same
pass on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from streamrec.control.trainer_config import TrainerConfig
from streamrec.trainer.device import resolve_device
from streamrec.trainer.errors import ConfigError
from streamrec.trainer.model.staging import Staging
from streamrec.trainer.runner import OnlineTrainer
from trainer_helpers import small_config

ROOT = Path(__file__).resolve().parents[2]
#: a child process that sees no GPU, whatever this machine has
NO_GPU_ENV = dict(os.environ, CUDA_VISIBLE_DEVICES="")


def test_device_is_set_in_the_runner_section_or_as_the_rest_jobs_model_device():
    assert TrainerConfig.parse({}).runner.device == "auto"
    assert TrainerConfig.parse({"device": "cuda"}).runner.device == "cuda"
    assert TrainerConfig.parse({"runner": {"device": "cpu"}}).runner.device == "cpu"
    same = TrainerConfig.parse({"device": "cpu", "runner": {"device": "cpu"}})
    assert same.runner.device == "cpu"
    with pytest.raises(ValueError, match="device 'cuda' contradicts runner.device 'cpu'"):
        TrainerConfig.parse({"device": "cuda", "runner": {"device": "cpu"}})
    with pytest.raises(ValueError, match=r"runner\.device.*'gpu'"):
        TrainerConfig.parse({"runner": {"device": "gpu"}})
    with pytest.raises(ValueError, match="device"):
        TrainerConfig.parse({"device": "tpu"})


def test_nccl_with_a_cpu_model_is_refused_naming_both():
    with pytest.raises(ValueError, match=r"distributed\.backend 'nccl'.*runner\.device 'cpu'"):
        TrainerConfig.parse({"runner": {"device": "cpu"}, "distributed": {"backend": "nccl"}})
    for device in ("auto", "cuda"):  # nccl joins GPUs
        cfg = {"runner": {"device": device}, "distributed": {"backend": "nccl"}}
        assert TrainerConfig.parse(cfg).distributed.backend == "nccl"


def test_what_each_setting_gives_with_and_without_a_gpu():
    cpu = torch.device("cpu")
    assert resolve_device("auto", gpus=0) == cpu
    assert resolve_device("cpu", gpus=4) == cpu
    assert resolve_device("auto", gpus=1, local_rank=0) == torch.device("cuda", 0)
    assert resolve_device("cuda", gpus=2, local_rank=3) == torch.device("cuda", 1)  # its node's
    with pytest.raises(ConfigError, match=r"runner\.device 'cuda'.*no CUDA GPU"):
        resolve_device("cuda", gpus=0)
    with pytest.raises(ConfigError, match=r"runner\.device.*'gpu'"):
        resolve_device("gpu", gpus=1)


@pytest.mark.timeout(120)
def test_a_trainer_asked_for_cuda_where_there_is_no_gpu_refuses_to_start(tmp_path):
    script = (
        "from streamrec.control.trainer_config import TrainerConfig\n"
        "from streamrec.trainer.runner import OnlineTrainer\n"
        f"OnlineTrainer(TrainerConfig.parse({{'device': 'cuda', 'runner': "
        f"{{'model_save_path': {str(tmp_path / 'm')!r}}}}}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        env=NO_GPU_ENV,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert out.returncode != 0
    assert "ConfigError: runner.device 'cuda'" in out.stderr and "no CUDA GPU" in out.stderr


@pytest.mark.timeout(120)
@pytest.mark.parametrize("script", ["trainer.py", "reference_dlrm.py"])
def test_the_benchmarks_refuse_device_cuda_where_there_is_no_gpu(tmp_path, script):
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), "--device", "cuda", "--setup", "b"],
        env=NO_GPU_ENV,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert f"{script} --device cuda:" in out.stderr and "sees no CUDA GPU" in out.stderr
    assert out.stdout == "" and not list(tmp_path.iterdir())  # nothing measured or written


def run_day(
    stream: Path, model: Path, device: str, precision: str = "fp32", staged: bool = False
) -> tuple:
    """The first day of the planted stream (2 passes) on ``device``: the pass records, the
    staging's buffer allocations after the first pass and after the last. ``staged``: a CPU
    model's inputs through the staging's buffers too (the GPU's path, a host copy at its end)."""
    base = small_config(stream, model, end_day="20190720").model_dump(mode="json")
    base["runner"]["device"] = device
    base["hyper_parameters"]["precision"] = precision
    with OnlineTrainer(TrainerConfig.parse(base)) as trainer:
        if staged:
            trainer.staging = Staging(trainer.device, stage=True, pin=False)
        specs = trainer.passes_todo()
        records = [trainer.run_pass(specs[0])]
        warm = trainer.staging.allocations
        records += [trainer.run_pass(spec) for spec in specs[1:]]
        return records, warm, trainer.staging.allocations


def test_a_cpu_pass_says_its_device_and_stages_nothing(stream, tmp_path):
    records, warm, after = run_day(stream, tmp_path / "m", "cpu")
    assert [r["device"] for r in records] == ["cpu", "cpu"]
    assert warm == after == 0
    lines = (tmp_path / "m" / "passes.jsonl").read_text().splitlines()
    assert [json.loads(line)["device"] for line in lines] == ["cpu", "cpu"]


def test_the_staged_path_trains_exactly_as_the_direct_one(stream, tmp_path):
    """The rows and dense features through the buffers, the rows' gradient back through the
    staged copy's backward into the store's push: the same model to the last bit."""
    direct, _, _ = run_day(stream, tmp_path / "direct", "cpu")
    staged, warm, after = run_day(stream, tmp_path / "staged", "cpu", staged=True)
    assert warm == after == 4  # rows and dense, 2 slots each, allocated in the first steps only
    keys = ("predict_auc", "train_auc", "logloss", "predict_logloss", "predicted_ctr", "step")
    assert [[r[k] for k in keys] for r in staged] == [[r[k] for k in keys] for r in direct]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
@pytest.mark.timeout(300)
def test_a_pass_on_the_gpu_matches_the_same_pass_on_the_cpu(stream, tmp_path):
    """Same seed, same batches, fp32: the GPU's sums differ from the CPU's in the last bits
    only. The staging allocates its buffers in the first pass and nothing after it."""
    cpu, _, _ = run_day(stream, tmp_path / "cpu", "cpu")
    gpu, warm, after = run_day(stream, tmp_path / "gpu", "cuda")
    assert all(r["device"].startswith("cuda") for r in gpu)
    assert 0 < warm == after <= 8  # rows, dense: 2 slots each, grown once at most; none after
    for c, g in zip(cpu, gpu, strict=True):
        assert g["samples"] == c["samples"] > 0
        for key in ("predict_auc", "train_auc", "logloss", "predict_logloss"):
            if c[key] is None:
                assert g[key] is None
                continue
            assert abs(g[key] - c[key]) < 0.01, (key, c[key], g[key])
    bf16, _, _ = run_day(stream, tmp_path / "bf16", "cuda", "auto")
    assert [r["precision"] for r in bf16] == ["bf16", "bf16"]
    assert abs(bf16[-1]["train_auc"] - cpu[-1]["train_auc"]) < 0.03
