"""Lab 06's degree arithmetic (minigpt/parallel/mesh/degrees.py): every branch, every error (each
names every number involved and the world size), the effective batch and both learning-rate rules
against numbers worked out by hand; and the mesh script's refusals that need a world of four."""

from __future__ import annotations

import argparse
import math

import pytest

from minigpt.parallel.mesh import BatchPlan, resolve_accelerate, resolve_hsdp, sagemaker_dp_degree, torchrun_layout

# ----------------------------------------------------------------------------------------------
# OLMo-core style HSDP


@pytest.mark.parametrize(
    "world, local, shard, replicate, expected",
    [
        (4, 2, None, None, (2, 2)),  # two nodes of two: replicate over nodes, shard inside one
        (8, 4, None, None, (2, 4)),
        (4, 4, None, None, (1, 4)),  # one node: plain FSDP
        (4, 4, 2, None, (2, 2)),  # the shard given: replicate inferred
        (8, 8, None, 4, (4, 2)),  # the replicate given: shard inferred
        (6, 3, 3, 2, (2, 3)),  # both given
        (1, 1, None, None, (1, 1)),
    ],
)
def test_resolve_hsdp(world, local, shard, replicate, expected):
    assert resolve_hsdp(world, local, shard=shard, replicate=replicate) == expected


@pytest.mark.parametrize(
    "world, local, shard, replicate, names",
    [
        (4, 4, 3, 2, ["replicate 2", "shard 3", "= 6", "world size is 4"]),
        (4, 4, 3, None, ["shard 3", "world size 4", "4 / 3"]),
        (6, 6, None, 4, ["replicate 4", "world size 6", "6 / 4"]),
        (6, 4, None, None, ["world size 6", "nodes of 4 ranks"]),
        (4, 2, 0, None, ["shard 0", "world size 4"]),
        (0, 1, None, None, ["world size 0"]),
    ],
)
def test_resolve_hsdp_refuses(world, local, shard, replicate, names):
    with pytest.raises(ValueError) as caught:
        resolve_hsdp(world, local, shard=shard, replicate=replicate)
    assert all(n in str(caught.value) for n in names), str(caught.value)


# ----------------------------------------------------------------------------------------------
# Accelerate's ParallelismConfig and SageMaker


def test_resolve_accelerate_infers_only_plain_data_parallelism():
    """Accelerate's rules (``ParallelismConfig.__post_init__`` and ``_validate_accelerator``): the degrees
    given must multiply to the world size; only when every one is left at 1 does dp_replicate become it."""
    assert resolve_accelerate(8) == {"dp_replicate": 8, "dp_shard": 1, "tp": 1, "cp": 1, "dp": 8}
    assert resolve_accelerate(8, dp_shard=4, tp=2) == {"dp_replicate": 1, "dp_shard": 4, "tp": 2, "cp": 1, "dp": 4}
    assert resolve_accelerate(16, dp_replicate=2, dp_shard=2, tp=2, cp=2)["dp"] == 4
    assert resolve_accelerate(4, dp_replicate=2, dp_shard=2)["dp"] == 4  # HSDP


@pytest.mark.parametrize(
    "world, kwargs, names",
    [
        (4, dict(dp_replicate=2, dp_shard=2, tp=2), ["dp_replicate 2", "dp_shard 2", "tp 2", "cp 1", "= 8", "is 4"]),
        # one degree left out is not inferred: 1 x 2 x 2 x 1 = 4 on 8 processes
        (8, dict(dp_shard=2, tp=2), ["dp_replicate 1", "dp_shard 2", "tp 2", "= 4", "world size is 8"]),
        # DDP + TP, as in ParallelismConfig(dp_replicate_size=2, tp_size=4): refused whatever the product
        (8, dict(dp_replicate=2, tp=4), ["dp_replicate 2", "dp_shard 1", "tp 4", "pure replication", "world size 8"]),
        (8, dict(dp_shard=2, tp=0), ["tp 0", "world size 8"]),
    ],
)
def test_resolve_accelerate_refuses(world, kwargs, names):
    with pytest.raises(ValueError) as caught:
        resolve_accelerate(world, **kwargs)
    assert all(n in str(caught.value) for n in names), str(caught.value)


def test_sagemaker_dp_degree():
    assert sagemaker_dp_degree(8, 2, 4) == 4  # 16 processes, 4 pipeline stages
    assert sagemaker_dp_degree(4, 1, 1) == 4
    with pytest.raises(ValueError) as caught:
        sagemaker_dp_degree(4, 2, 3)
    message = str(caught.value)
    assert all(n in message for n in ("pipeline_degree 3", "world size 8", "processes_per_host 4", "instance_count 2"))
    with pytest.raises(ValueError, match="instance_count 0"):
        sagemaker_dp_degree(4, 0, 1)


# ----------------------------------------------------------------------------------------------
# The batch and the learning rate


def test_batch_plan_by_hand():
    plan = BatchPlan(micro_batch=16, grad_accum=2, dp_world_size=4, base_lr=3e-3)
    assert plan.effective_batch == 128 and plan.reference_batch == 32
    assert plan.lr("linear") == pytest.approx(3e-3 * 4)  # 128 / 32 = 4
    assert plan.lr("sqrt") == pytest.approx(3e-3 * 2)  # sqrt(4) = 2
    tuned = BatchPlan(micro_batch=8, grad_accum=1, dp_world_size=2, base_lr=1e-3, base_batch=64)
    assert tuned.effective_batch == 16
    assert tuned.lr("linear") == pytest.approx(1e-3 / 4) and tuned.lr("sqrt") == pytest.approx(1e-3 / 2)
    line = plan.describe()
    assert "= 128" in line and "0.012" in line and "0.006" in line, line
    assert BatchPlan(5, 3, 3, 1.0, base_batch=5).lr("sqrt") == pytest.approx(math.sqrt(45 / 5))
    with pytest.raises(ValueError, match="micro_batch 0"):
        BatchPlan(0, 1, 1, 1.0)
    with pytest.raises(ValueError, match="base_lr"):
        BatchPlan(1, 1, 1, 0.0)


def test_torchrun_layout():
    assert torchrun_layout({}) == (1, 1)
    assert torchrun_layout({"WORLD_SIZE": "4"}) == (4, 4)
    assert torchrun_layout({"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}) == (4, 2)
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE=3"):
        torchrun_layout({"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "3"})
    with pytest.raises(ValueError, match="WORLD_SIZE=x"):
        torchrun_layout({"WORLD_SIZE": "x"})


# ----------------------------------------------------------------------------------------------
# The mesh script's refusals on a world of four (in this process: check_args, before any group)


def mesh_args(**overrides) -> argparse.Namespace:
    from minigpt.runners.lab06_mesh import parse_args

    args = parse_args([])
    for k, v in overrides.items():
        setattr(args, k, v)
    return args


@pytest.mark.parametrize(
    "overrides, local, names",
    [
        (dict(shard=3, replicate=2), 4, ["--replicate 2 --shard 3", "= 6", "world size is 4"]),
        (dict(shard=3), 4, ["--shard 3", "world size 4"]),
        (dict(replicate=3), 4, ["--replicate 3", "world size 4"]),
        (dict(tp=3), 4, ["--tp 3", "world size 4"]),
        (dict(), 3, ["LOCAL_WORLD_SIZE=3", "world size 4"]),
    ],
)
def test_the_mesh_script_refuses_degrees_of_a_world_of_four(overrides, local, names):
    from minigpt.runners.lab06_mesh import check_args

    with pytest.raises(ValueError) as caught:
        check_args(mesh_args(**overrides), 4, local)
    assert all(n in str(caught.value) for n in names), str(caught.value)


def test_the_mesh_script_refuses_tp_that_does_not_divide_the_heads():
    from minigpt.runners.lab06_mesh import check_args

    with pytest.raises(ValueError, match="--tp 8 does not divide MiniGPT's 4 attention heads"):
        check_args(mesh_args(tp=8), 8, 8)
    cfg, degrees = check_args(mesh_args(shard=2), 4, 4)
    assert degrees == {"hsdp": {"replicate": 2, "shard": 2}, "dp_tp": {"dp": 2, "tp": 2}}


def test_the_mesh_script_exits_2_under_a_launcher_of_four(monkeypatch, capsys):
    from minigpt import cli
    from minigpt.runners.lab06_mesh import main

    monkeypatch.setattr(cli, "PEERS_GRACE_S", 0.0)
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4"}.items():
        monkeypatch.setenv(name, value)
    assert main(["--shard", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--shard 3" in err[0] and "world size 4" in err[0], err
