"""Where each rank runs: the device decision (minigpt.parallel.launch.place) is a pure function of what a
process sees, so every branch is tested here without a GPU, by handing it what a machine with GPUs
would show. The lab scripts' side (entry.placement, entry.main) is tested with the same fakes: the
command that would use the GPUs comes from the lab's own check of its arguments, and an impossible
``--device cuda`` is refused (exit 2, one line) before any process group exists."""

from __future__ import annotations

import contextlib
import io
import os

import pytest
import torch

from minigpt import cli
from minigpt.parallel import launch, proof
from minigpt.runners import entry, lab01_ddp, lab07_nd_parallel


def seen(gpus: int, ranks: int, cuda_build: bool = True, nvidia: bool = False) -> launch.Seen:
    """What a process on a machine with ``gpus`` visible GPUs and ``ranks`` local ranks sees."""
    return launch.Seen(
        cuda_build=cuda_build,
        cuda_available=cuda_build and gpus > 0,
        gpu_count=gpus if cuda_build else 0,
        local_ranks=ranks,
        nvidia_present=nvidia or gpus > 0,
        torch_version="2.13.0" if cuda_build else "2.13.0+cpu",
    )


# ------------------------------------------------------------------------------------------------
# launch.place: every branch


def test_no_cuda_is_gloo_on_the_cpu_and_says_nothing():
    """A CPU build on a laptop: today's behaviour, no line at start."""
    assert launch.place("auto", seen(0, 2, cuda_build=False)) == launch.Placement("gloo", "cpu", None)


def test_a_cpu_build_on_a_machine_with_an_nvidia_gpu_is_the_cpu_case_and_says_why():
    where = launch.place("auto", seen(0, 2, cuda_build=False, nvidia=True))
    assert (where.backend, where.device_type) == ("gloo", "cpu")
    assert "2.13.0+cpu" in where.note and "CPU build" in where.note and "NVIDIA GPU" in where.note


def test_a_cuda_build_without_a_gpu_is_the_cpu_case_silently():
    """PyPI's Linux torch is the CUDA build: on a laptop without a GPU it is the plain CPU case."""
    assert launch.place("auto", seen(0, 2)) == launch.Placement("gloo", "cpu", None)


def test_one_gpu_and_two_ranks_falls_back_to_the_cpu_with_the_command_that_uses_the_gpu():
    command = "torchrun --nproc_per_node=1 lab/01_ddp.py --check"
    where = launch.place("auto", seen(1, 2), gpu_command=command)
    assert (where.backend, where.device_type) == ("gloo", "cpu")
    assert "2 ranks on this machine but 1 GPU" in where.note and "NCCL needs a GPU per rank" in where.note
    assert where.note.endswith(f"to use the GPU: {command}")


def test_fewer_gpus_than_a_lab_needs_says_so_instead_of_a_command():
    where = launch.place("auto", seen(4, 8), gpu_command=None)
    assert (where.backend, where.device_type) == ("gloo", "cpu")
    assert "8 ranks on this machine but 4 GPUs" in where.note
    assert "this lab needs more ranks than the 4 GPUs here" in where.note


def test_as_many_gpus_as_ranks_is_nccl_one_gpu_each():
    where = launch.place("auto", seen(2, 2))
    assert (where.backend, where.device_type) == ("nccl", "cuda")
    assert "one GPU per rank (2 of the 2 GPUs here)" in where.note


def test_more_gpus_than_ranks_is_nccl_on_the_first_ones():
    where = launch.place("auto", seen(8, 4))
    assert (where.backend, where.device_type) == ("nccl", "cuda") and "4 of the 8 GPUs" in where.note


def test_four_gpus_and_eight_ranks_is_the_cpu_with_the_command_for_four():
    command = "torchrun --nproc_per_node=4 lab/06_mesh.py --shard 2 --check"
    where = launch.place("auto", seen(4, 8), gpu_command=command)
    assert (where.backend, where.device_type) == ("gloo", "cpu")
    assert where.note.endswith(f"to use the GPUs: {command}")


def test_device_cpu_with_gpus_is_the_cpu_and_says_they_stay_idle():
    where = launch.place("cpu", seen(2, 2))
    assert (where.backend, where.device_type) == ("gloo", "cpu")
    assert "--device cpu" in where.note and "2 GPUs here stay idle" in where.note
    assert launch.place("cpu", seen(0, 2)) == launch.Placement("gloo", "cpu", None)


def test_device_cuda_with_enough_gpus_is_nccl():
    where = launch.place("cuda", seen(2, 2))
    assert (where.backend, where.device_type) == ("nccl", "cuda")


@pytest.mark.parametrize(
    ("machine", "words"),
    [
        (
            seen(1, 2),
            ["--device cuda", "2 ranks on this machine need 2 GPUs", "torch sees 1 GPU", "--nproc_per_node=1"],
        ),
        (seen(4, 8), ["--device cuda", "8 ranks on this machine need 8 GPUs", "torch sees 4 GPUs"]),
        (seen(0, 2), ["--device cuda", "sees no GPU", "CUDA_VISIBLE_DEVICES"]),
        (seen(0, 1, cuda_build=False, nvidia=True), ["--device cuda", "2.13.0+cpu", "CPU build"]),
    ],
    ids=["1 GPU, 2 ranks", "4 GPUs, 8 ranks", "CUDA build, no GPU", "CPU build"],
)
def test_device_cuda_without_a_gpu_for_every_rank_is_refused_naming_the_counts(machine, words):
    with pytest.raises(cli.BadInput) as refused:
        launch.place("cuda", machine)
    for word in words:
        assert word in str(refused.value), str(refused.value)


def test_a_device_that_is_no_device_is_refused():
    with pytest.raises(cli.BadInput, match="--device tpu: not a device; choose from auto, cpu, cuda"):
        launch.place("tpu", seen(0, 1))


# ------------------------------------------------------------------------------------------------
# what the process reads: the flag, MINIGPT_DEVICE, LOCAL_WORLD_SIZE


def test_the_flag_wins_over_the_variable_and_the_variable_over_auto():
    assert launch.requested_device("cpu", {"MINIGPT_DEVICE": "cuda"}) == ("cpu", "--device")
    assert launch.requested_device(None, {"MINIGPT_DEVICE": "cuda"}) == ("cuda", "MINIGPT_DEVICE")
    assert launch.requested_device(None, {"MINIGPT_DEVICE": " "}) == ("auto", "default")
    assert launch.requested_device(None, {}) == ("auto", "default")
    with pytest.raises(cli.BadInput, match="MINIGPT_DEVICE=gpu: not a device; choose from auto, cpu, cuda"):
        launch.requested_device(None, {"MINIGPT_DEVICE": "gpu"})


def test_the_variable_names_itself_in_a_refusal():
    with pytest.raises(cli.BadInput, match="^MINIGPT_DEVICE cuda: "):
        launch.place("cuda", seen(0, 2), source="MINIGPT_DEVICE")


def test_local_ranks_come_from_torchrun():
    assert launch.local_ranks({}) == 1
    assert launch.local_ranks({"LOCAL_WORLD_SIZE": "4", "WORLD_SIZE": "8"}) == 4
    assert launch.local_ranks({"WORLD_SIZE": "2"}) == 2
    with pytest.raises(cli.BadInput, match="LOCAL_WORLD_SIZE=two: not a positive integer"):
        launch.local_ranks({"LOCAL_WORLD_SIZE": "two"})


def test_this_machine_is_seen_as_it_is():
    """What seen_here reads on the machine running the suite, and the decision it gives."""
    here = launch.seen_here({"LOCAL_WORLD_SIZE": "2"})
    assert here.cuda_build == (torch.version.cuda is not None)
    assert here.local_ranks == 2
    where = launch.place("auto", here)
    if torch.cuda.is_available() and torch.cuda.device_count() >= 2:
        assert (where.backend, where.device_type) == ("nccl", "cuda")
    else:  # the course's CPU machines: gloo on the CPU
        assert (where.backend, where.device_type) == ("gloo", "cpu")


# ------------------------------------------------------------------------------------------------
# the lab scripts' side: the command comes from the lab's own checks


def parsed(module, argv):
    return module.parse_args(argv)


def test_lab01_on_one_gpu_suggests_one_rank_per_gpu_with_its_own_arguments():
    args = parsed(lab01_ddp, ["--check", "--report", "out/lab01.json"])
    where = entry.placement(
        lab01_ddp.PROG,
        args,
        ["--check", "--report", "out/lab01.json"],
        2,
        lambda n: lab01_ddp.check_args(args, n),
        seen(1, 2),
    )
    assert where.device_type == "cpu"
    assert where.note.endswith(
        "to use the GPU: torchrun --nproc_per_node=1 lab/01_ddp.py --check --report out/lab01.json"
    )


def test_two_machines_of_one_gpu_each_suggest_the_command_on_each_machine():
    args = parsed(lab01_ddp, ["--check"])
    where = entry.placement(lab01_ddp.PROG, args, ["--check"], 4, lambda n: lab01_ddp.check_args(args, n), seen(1, 2))
    assert where.note.endswith("torchrun --nproc_per_node=1 lab/01_ddp.py --check (on each machine)")


def test_lab07_on_four_gpus_cannot_run_on_four_ranks_and_says_so():
    """Lab 07's mesh is 8 ranks: its own check refuses a world of 4, so no command is offered."""
    args = parsed(lab07_nd_parallel, ["--check"])
    where = entry.placement(
        lab07_nd_parallel.PROG, args, ["--check"], 8, lambda n: lab07_nd_parallel.LAB.check_args(args, n), seen(4, 8)
    )
    assert where.device_type == "cpu" and "this lab needs more ranks than the 4 GPUs here" in where.note


class Started(Exception):
    """The trip-wire: the script went as far as launch.init (with what it was given)."""


def run_main(module, argv, machine, monkeypatch, environ):
    """``module.main(argv)`` on a faked machine under torchrun's variables ``environ``: (exit status or
    the Started trip-wire, stdout, stderr). Nothing here starts a process group."""
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "TORCHELASTIC_ERROR_FILE", "MINIGPT_DEVICE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(launch, "seen_here", lambda environ=None: machine)

    def init(timeout_s, placement=None):
        raise Started(placement)

    monkeypatch.setattr(launch, "init", init)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = module.main(argv)
        except SystemExit as exc:
            code = exc.code
        except Started as exc:
            code = exc
    return code, out.getvalue(), err.getvalue()


TWO_RANKS = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}


def test_device_cuda_with_too_few_gpus_is_exit_2_in_one_line_before_any_group(monkeypatch):
    code, out, err = run_main(lab01_ddp, ["--device", "cuda", "--check"], seen(1, 2), monkeypatch, TWO_RANKS)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("[rank 1] lab/01_ddp.py: error: --device cuda: 2 ranks on this machine need 2 GPUs")


def test_minigpt_device_is_read_when_the_flag_is_not_given(monkeypatch):
    code, _, err = run_main(lab01_ddp, ["--check"], seen(0, 1), monkeypatch, {"MINIGPT_DEVICE": "cuda"})
    assert code == 2 and "lab/01_ddp.py: error: MINIGPT_DEVICE cuda: torch 2.13.0 sees no GPU" in err, err


def test_the_fallback_line_is_said_by_rank_0_only_and_the_group_starts_on_the_cpu(monkeypatch):
    rank0 = {**TWO_RANKS, "RANK": "0", "LOCAL_RANK": "0"}
    started, out, err = run_main(lab01_ddp, ["--check"], seen(1, 2), monkeypatch, rank0)
    assert isinstance(started, Started) and err == ""
    placement = started.args[0]
    assert (placement.backend, placement.device_type) == ("gloo", "cpu")
    assert out == f"[rank 0] {placement.note}\n"
    assert out.startswith("[rank 0] device: CPU with gloo: 2 ranks on this machine but 1 GPU")
    started, out, _ = run_main(lab01_ddp, ["--check"], seen(1, 2), monkeypatch, TWO_RANKS)
    assert isinstance(started, Started) and out == ""  # rank 1 says nothing


def test_on_a_machine_without_a_gpu_nothing_is_said(monkeypatch):
    started, out, err = run_main(lab01_ddp, ["--check"], seen(0, 2), monkeypatch, {**TWO_RANKS, "RANK": "0"})
    assert started.args[0] == launch.Placement("gloo", "cpu", None) and out == err == ""


# ------------------------------------------------------------------------------------------------
# the rulers on a GPU


def test_the_rulers_change_nothing_on_the_cpu():
    before = proof.cuda_settings()
    assert proof.rulers_on(torch.device("cpu")) == {}
    assert proof.cuda_settings() == before


def test_the_rulers_on_cuda_turn_tf32_off_and_determinism_on(monkeypatch):
    """What rulers_on sets for a CUDA check; these switches exist in every build, so a CPU machine
    can read them (nothing here starts CUDA). Restored afterwards."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    saved = (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.deterministic,
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    try:
        settings = proof.rulers_on(torch.device("cuda", 0))
        assert settings == {
            "allow_tf32_matmul": False,
            "allow_tf32_cudnn": False,
            "deterministic_algorithms": True,
            "cublas_workspace_config": ":4096:8",
        }
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        assert torch.is_deterministic_algorithms_warn_only_enabled()  # a missing one warns, naming the op
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    finally:
        (
            torch.backends.cuda.matmul.allow_tf32,
            torch.backends.cudnn.allow_tf32,
            torch.backends.cudnn.benchmark,
            torch.backends.cudnn.deterministic,
        ) = saved[:4]
        torch.use_deterministic_algorithms(saved[4], warn_only=saved[5])


def test_lab01s_page_quotes_the_line_a_one_gpu_laptop_prints():
    """Lab 01's guide (both languages) shows the line make demo's rank 0 prints on a machine with one GPU:
    the one the decision gives for 2 ranks and 1 GPU, with make demo's arguments."""
    from pathlib import Path

    argv = ["--check", "--report", "out/lab01.json"]
    args = parsed(lab01_ddp, argv)
    where = entry.placement(lab01_ddp.PROG, args, argv, 2, lambda n: lab01_ddp.check_args(args, n), seen(1, 2))
    root = Path(__file__).resolve().parent.parent
    for page in ("lab/01-ddp-from-scratch.md", "lab/01-ddp-from-scratch.es.md"):
        text = (root / page).read_text(encoding="utf-8")
        assert f"\n[rank 0] {where.note}\n" in text, f"{page} does not quote: [rank 0] {where.note}"
