"""The job config: PaddleRec shape, DLRM names, unknown keys named, CLI flags."""

import argparse

import pytest
import yaml
from streamrec.control.trainer_config import TrainerConfig
from streamrec.errors import BadRequest
from streamrec.trainer.__main__ import _train_parser, load_config

JOB = """
runner:
  train_data_dir: data
  reader_type: criteo
  split_interval: 5
  split_per_pass: 2
  start_day: 20190720
  end_day: "20190721"
  data_donefile: to.hadoop.done
  data_sleep_second: 1
  checkpoint_per_pass: 2
  save_delta_frequency: 6
  model_save_path: output_model
  train_batch_size: 128
hyper_parameters:
  arch_sparse_feature_size: 16
  arch_mlp_bot: 13-512-256-64-16
  arch_mlp_top: 512-256-1
  arch_interaction_op: dot
  loss_function: wbce
  loss_weights: 1.0-3.0
  learning_rate: 0.1
  optimizer: adagrad
  lr_num_warmup_steps: 10
  lr_decay_start_step: 20
  lr_num_decay_steps: 30
table_parameters:
  embedx_threshold: 0
"""


def test_yaml_in_paddlerec_shape(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(JOB)
    c = TrainerConfig.from_yaml(path)
    assert c.runner.data_format == "criteo" and c.runner.start_day == "20190720"
    assert c.hyper_parameters.arch_mlp_bot == [13, 512, 256, 64, 16]
    assert c.hyper_parameters.loss_weights == [1.0, 3.0]
    assert c.table_names[:2] == ["slot_0", "slot_1"] and len(c.table_names) == 26


@pytest.mark.parametrize(
    "patch,match",
    [
        ({"runner": {"bogus_knob": 1}}, r"runner\.bogus_knob: Extra inputs"),
        ({"hyper_parameters": {"arch_mlp_top": "a-b"}}, r"arch_mlp_top.*'a-b'"),
        ({"runner": {"split_interval": 7}}, r"split_interval.*divide 1440"),
        ({"runner": {"start_day": "20190799"}}, r"start_day.*YYYYMMDD"),
        ({"runner": {"reader_type": "criteo", "data_format": "generated"}}, r"contradicts"),
        ({"hyper_parameters": {"optimizer": "lbfgs"}}, r"optimizer"),
        (
            {"hyper_parameters": {"mini_batch_size": 64}, "runner": {"train_batch_size": 32}},
            r"mini_batch_size 64 contradicts",
        ),
        ({"nonsense": {}}, r"nonsense: Extra inputs"),
        ({"store": {"addresses": ["tcp://h:1"]}}, r"store.addresses was renamed store.endpoints"),
        ({"store": {"tier": "gpu"}}, r"store.tier: Input should be 'host', 'ssd' or 'device'"),
        ({"resources": {"trainer_ranks": 0}}, r"resources.trainer_ranks: Input should be greater"),
        ({"resources": {"threads": 2}}, r"resources.threads: Extra inputs"),
    ],
)
def test_bad_values_name_field_and_value(patch, match):
    with pytest.raises(BadRequest, match=match):
        TrainerConfig.parse(patch)


def test_mini_batch_size_is_an_alias():
    c = TrainerConfig.parse({"hyper_parameters": {"mini_batch_size": 64}})
    assert c.runner.train_batch_size == 64


def test_flags_override_the_file(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(JOB)
    args = _train_parser("t").parse_args(
        [
            "--config",
            str(path),
            "--learning-rate",
            "0.5",
            "--arch-mlp-bot",
            "13-64-16",
            "--end-day",
            "20190725",
            "--data-donefile",
            "",
        ]
    )
    c = load_config(args)
    assert c.hyper_parameters.learning_rate == 0.5
    assert c.hyper_parameters.arch_mlp_bot == [13, 64, 16]
    assert c.runner.end_day == "20190725" and c.runner.data_donefile is None
    assert c.runner.train_batch_size == 128  # from the file
    with pytest.raises(BadRequest, match="learning_rate"):
        load_config(argparse.Namespace(config=None, **{"hyper_parameters.learning_rate": "-1"}))
    assert yaml.safe_load(JOB)["runner"]["split_per_pass"] == 2


def test_resources_checked_and_applied():
    import torch
    from streamrec.control.trainer_config import ResourcesConfig
    from streamrec.trainer.distributed import apply_resources
    from streamrec.trainer.errors import ConfigError

    with pytest.raises(ConfigError, match="trainer_ranks is 2 but this trainer group has 1 rank"):
        apply_resources(ResourcesConfig(trainer_ranks=2), 1)
    before = torch.get_num_threads()
    try:
        apply_resources(ResourcesConfig(trainer_ranks=2, threads_per_rank=1), 2)
        assert torch.get_num_threads() == 1
        apply_resources(ResourcesConfig(), 5)  # nothing asked: any size, threads unchanged
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_the_missing_item_id_is_the_samplers():
    from streamrec.sampler import MISSING_ITEM_ID

    assert TrainerConfig.parse({}).negative_sampling.default_value is None  # the sampler's
    assert MISSING_ITEM_ID == 5533571732986600803  # the seed's murmurhash(0)


def test_the_schema_in_a_job_file_and_as_a_flag(tmp_path):
    """runner.schema (YAML) and --schema (inline YAML) give the same features; the slot
    count follows the schema; a bad one names its field."""
    path = tmp_path / "job.yaml"
    path.write_text(
        "runner:\n  data_format: slot\n  schema:\n    label: click\n    dense: [age]\n"
        "    sparse:\n      - {name: user_id}\n      - {name: genres, pooling: mean}\n"
        "hyper_parameters:\n  arch_mlp_bot: 1-16\n"
    )
    c = load_config(_train_parser("t").parse_args(["--config", str(path)]))
    assert c.runner.feature_schema is not None
    assert [s.name for s in c.runner.feature_schema.sparse] == ["user_id", "genres"]
    assert c.hyper_parameters.sparse_inputs_slots == 2 and c.pooling == ["sum", "mean"]
    inline = "{label: click, dense: [age], sparse: [{name: u}]}"
    f = load_config(_train_parser("t").parse_args(["--config", str(path), "--schema", inline]))
    assert f.runner.feature_schema is not None and f.hyper_parameters.sparse_inputs_slots == 1
    with pytest.raises(BadRequest, match=r"runner.schema.sparse.0.pooling"):
        TrainerConfig.parse({"runner": {"schema": {"sparse": [{"name": "a", "pooling": "max"}]}}})
    # the trainer's own check (no API in between): the bottom MLP against the dense features
    with pytest.raises(BadRequest, match=r"runner.schema.dense: data_format 'generated'"):
        TrainerConfig.parse({"runner": {"schema": {"dense": ["a"], "sparse": [{"name": "b"}]}}})
    with pytest.raises(BadRequest, match=r"hyper_parameters.arch_mlp_bot: its first size"):
        TrainerConfig.parse(
            {
                "runner": {
                    "data_format": "slot",
                    "schema": {"dense": ["a"], "sparse": [{"name": "b"}]},
                },
                "hyper_parameters": {"arch_mlp_bot": "2-16"},
            }
        )
