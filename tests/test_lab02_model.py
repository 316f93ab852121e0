"""Lab 02's model and simulator, beyond what the graded tests (tests/test_lab02.py) check:
DeepSpeed's published estimator output, padding per unit, activations, and the numpy simulation
of every stage against stage 0 and against the analytic model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from minigpt.zero import analytic as za, comm, memory, mlp, simulate
from tests.limits import limit

GIB = 2**30


def test_deepspeed_estimators_reproduce_the_numbers_deepspeed_publishes():
    # DeepSpeed's docs (docs/code-docs/source/memory.rst), ..._all_cold for 2851M parameters,
    # 32M in the largest layer, 1 node of 8 GPUs; "GB" there is 2**30 bytes, 2 decimals.
    z3 = [(71.69, 0.12), (127.45, 0.12), (63.72, 0.78), (127.45, 0.78), (1.43, 6.09), (127.45, 6.09)]
    rows = memory.deepspeed_rows(3, 2851e6, 32e6, gpus_per_node=8)
    assert [(round(r.cpu / GIB, 2), round(r.gpu / GIB, 2)) for r in rows] == z3
    z2 = memory.deepspeed_rows(2, 2851e6, gpus_per_node=8)
    assert (round(z2[0].cpu / GIB, 2), round(z2[0].gpu / GIB, 2)) == (127.45, 5.31)
    assert round(z2[1].cpu / GIB, 2) == 127.45
    # The docs' 15.93 GB comes from the older stage-2 formula 4Ψ + 16Ψ/N; the current code
    # computes 2Ψ + 18Ψ/N, which is what this mode follows.
    assert round((4 * 2851e6 + 16 * 2851e6 / 8) / GIB, 2) == 15.93
    assert round(z2[1].gpu / GIB, 2) == 11.28
    with pytest.raises(ValueError, match="stages 2 and 3 only"):
        memory.deepspeed_estimate(1, 1e9)


def test_unit_collectives_pad_each_unit():
    units = [5, 8]
    cs = comm.unit_collectives(units, 3, 4, param_bytes=4, grad_bytes=4, reshard_after_forward=[False, True])
    # unit 0 padded 5 -> 8: one all-gather + one reduce-scatter; unit 1: two all-gathers + one
    sent = sum(c.bytes_sent for c in cs)
    assert sent == pytest.approx(3 / 4 * 4 * (8 * 2 + 8 * 3))
    assert sum(c.bytes_sent for c in comm.unit_collectives(units, 0, 4, 4, 4, pad=False)) == pytest.approx(
        2 * 3 / 4 * 4 * 13
    )


def test_activation_memory():
    s, b, h, a, layers = 2048, 1, 4096, 32, 32
    per_layer = s * b * h * (34 + 5 * a * s / h)  # Korthikanti et al., Table 2
    assert memory.activation_bytes(layers, s, b, h, a) == pytest.approx(layers * per_layer)
    assert memory.activation_bytes(layers, s, b, h, a, checkpointing=True) == pytest.approx(
        layers * 2 * s * b * h + per_layer
    )


@pytest.mark.parametrize("recipe_name", ["fp32", "mixed"])
def test_every_stage_matches_stage_0_and_the_model(recipe_name):
    spec = mlp.MLPSpec((12, 24, 20, 6))
    rec = memory.recipe(recipe_name)
    for n in (1, 2, 3, 4):
        runs = [simulate.simulate(stage, n, spec, steps=3, recipe_name=recipe_name, rows=24) for stage in za.STAGES]
        padded = [comm.padded(u, n) for u in spec.unit_sizes]
        for run in runs:
            where = f"stage {run.stage}, N={n}"
            for a, b in zip(runs[0].weights, run.weights):
                assert np.array_equal(a, b), where
            assert run.workers_agree, where
            expected = memory.device_memory(sum(padded), n, run.stage, recipe_name, largest_layer=max(padded))
            assert run.peak_model_state == [expected.device] * n, where
            sent = comm.unit_collectives(spec.unit_sizes, run.stage, n, rec.param_bytes, rec.reduce_bytes)
            assert run.bytes_sent_per_step == [sum(c.bytes_sent for c in sent)] * n, where
        # with units that N divides, the per-unit sum is the whole-model formula
        if all(u % n == 0 for u in spec.unit_sizes):
            for run in runs:
                assert run.bytes_sent_per_step[0] == comm.bytes_per_step(spec.n_params, run.stage, n, recipe_name)


def test_the_simulated_model_learns():
    run = simulate.simulate(3, 4, steps=200, rows=32)
    assert run.losses[-1] < 0.2 * run.losses[0]


def test_timeline_of_a_zero3_step():
    run = simulate.simulate(3, 2, mlp.MLPSpec((8, 16, 4)), steps=1, rows=4)
    labels = [(e.label, e.collective) for e in run.timeline]
    assert labels == [
        ("forward 0", "all-gather weights 0"),
        ("forward 1", "all-gather weights 1"),
        ("backward 1", "all-gather weights 1"),
        ("backward 1", "reduce-scatter gradients 1"),
        ("backward 0", "all-gather weights 0"),
        ("backward 0", "reduce-scatter gradients 0"),
        ("update", None),
    ]
    # while unit 1's gradient is reduce-scattered, its gathered weights (16*4+4 = 68 elements)
    # and its whole gradient are both held: 2 x 68 x 4 bytes of working buffer
    assert run.timeline[3].held["working"] == 2 * 68 * 4
    assert run.timeline[-1].held["working"] == 0


def test_simulator_rejects_bad_input():
    with pytest.raises(ValueError, match="stage 5 does not exist"):
        simulate.simulate(5, 2)
    with pytest.raises(ValueError, match="cannot be split evenly over 3 workers"):
        simulate.simulate(1, 3, rows=32)
    with pytest.raises(ValueError, match="n_workers must be a positive integer"):
        simulate.simulate(1, 0, rows=32)
    with pytest.raises(ValueError, match="widths"):
        mlp.MLPSpec((16,))


def _cli(*args: str):
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "lab" / "02_zero.py"
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=limit(60))


def test_cli_memory_and_comm_json_give_exact_bytes():
    import json

    out = json.loads(_cli("memory", "--params", "7.5e9", "--dp", "64", "--json").stdout)
    assert [round(m["device"]) for m in out["stages"].values()] == [
        round(16 * 7.5e9),
        round(4 * 7.5e9 + 12 * 7.5e9 / 64),
        round(2 * 7.5e9 + 14 * 7.5e9 / 64),
        round(16 * 7.5e9 / 64),
    ]
    text = _cli("memory", "--params", "7.5e9", "--dp", "64").stdout
    assert "31.4 GB" in text and "16.6 GB" in text and "1.88 GB" in text  # the paper's Table 1 row N = 64
    hsdp = json.loads(
        _cli("comm", "--params", "1e9", "--nodes", "4", "--gpus-per-node", "8", "--hsdp", "--json").stdout
    )
    assert (hsdp["shard_degree"], hsdp["replicas"]) == (8, 4)
    z3 = hsdp["stages"]["ZeRO-3"]
    assert z3["inside"] == pytest.approx(7 / 8 * 1e9 * 6) and z3["across"] == pytest.approx(2 * 3 / 4 * 1e9 / 8 * 2)
    ds = _cli("memory", "--params", "2851e6", "--gpus-per-node", "8", "--largest-layer", "32e6", "--deepspeed").stdout
    assert "71.69 GiB" in ds and "6.09 GiB" in ds


@pytest.mark.parametrize(
    "args, message",
    [
        (["memory", "--params", "-1", "--dp", "4"], "--params -1: negative; give a positive number"),
        (["memory", "--params", "0", "--dp", "4"], "--params 0: zero; give a positive number"),
        (["memory", "--params", "1e9", "--dp", "4", "--stage", "5"], "--stage 5: stage 5 does not exist"),
        (["memory", "--params", "1e9", "--dp", "0"], "--dp 0: zero; give a positive integer"),
        (
            ["memory", "--params", "1e9", "--dp", "8", "--shard-degree", "3"],
            "shard_degree 3 does not divide the world size 8",
        ),
        (
            ["comm", "--params", "1e9", "--dp", "8", "--shard-degree", "2", "--replicas", "3"],
            "the product must equal the world size",
        ),
        (["memory", "--params", "1e9", "--dp", "8", "--nodes", "3"], "--dp 8 is not a whole number"),
        (
            ["memory", "--params", "1e9", "--dp", "8", "--stage", "2", "--offload-params"],
            "--offload-params needs stage 3",
        ),
        (
            ["memory", "--params", "1e9", "--dp", "8", "--largest-layer", "-5"],
            "--largest-layer -5: negative; give a number >= 0",
        ),
        (["simulate", "--workers", "0"], "--workers 0: zero; give a positive integer"),
    ],
)
def test_cli_bad_input_exits_2_and_names_the_value(args, message):
    proc = _cli(*args)
    assert proc.returncode == 2 and message in proc.stderr and proc.stdout == "", proc.stderr


def test_the_simulator_command_holds_every_stage_against_the_model():
    import json

    out = json.loads(_cli("simulate", "--workers", "3", "--json").stdout)
    for name, r in out["stages"].items():
        assert r["same_weights_as_ddp"], name
        assert (r["peak_model_state"], r["bytes_sent_per_step"]) == (r["predicted_memory"], r["predicted_bytes"]), name


def test_the_zero_package_never_imports_torch():
    import subprocess
    import sys

    code = (
        "import sys, minigpt.runners.lab02_zero, minigpt.zero.simulate, minigpt.zero.comm, minigpt.zero.memory; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=limit(60))
