"""The tail every lab script shares: parse, refuse bad input on every rank, render, start the group,
run, report, tear down. A runner keeps only what its lab distributes.

    def main(argv=None) -> int:
        return entry.main(LAB, argv)

where ``LAB = entry.Lab(prog, parse_args, check_args, measure, ...)``:

* ``parse_args(argv)`` - the lab's :class:`minigpt.cli.ArgumentParser` (every number checked by its
  rule as it is parsed; :func:`add_check_flags` adds the flags of the proof);
* ``check_args(args, world_size)`` - the settings, or ``ValueError`` naming the value that cannot
  work (before any process group exists: every rank refuses with the same line, exit 2);
* ``measure(settings, args, ctx)`` - the lab's work; it returns the report, whose
  ``criterion_pass`` (or the lab's ``verdict_key``; when present) is the exit status: 0 when every
  criterion holds, 1 otherwise;
* ``render(path)`` - the page's fragments from a report (``--render JSON``), with the keys a
  report must have and an example path for the refusal line.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from minigpt import cli, impl, kernel_sets
from minigpt.parallel import launch, proof


@dataclass(frozen=True)
class Lab:
    prog: str
    parse_args: Callable[[list[str] | None], argparse.Namespace]
    check_args: Callable[[argparse.Namespace, int], object]
    measure: Callable[[object, argparse.Namespace, launch.DistContext], dict]
    render: str | None = None  # "module:function" of minigpt.pages, imported only to render
    render_keys: tuple[str, ...] = ()
    render_example: str = ""
    world_size: Callable[[], int] | None = None  # the world size check_args sees (default: WORLD_SIZE)
    summary: Callable[[dict], list[str]] | None = None  # the report's lines, printed before rendering
    verdict_key: str = "criterion_pass"  # the report's key whose truth is exit status 0 (absent: 0)


def add_run_flags(
    p: argparse.ArgumentParser,
    quiet: bool = True,
    learner_code: bool = True,
    trace: str | None = None,
) -> None:
    """A distributed lab's own flags, the same in every lab: ``--impl`` (where it runs the learner's
    code), ``--timeout``, ``--quiet``, ``--report``, ``--render``, and ``--trace DIR`` where the
    profiler records a few steps as ``DIR/<trace>-rank<r>.json.gz``."""
    if learner_code:
        p.add_argument(
            "--impl",
            choices=impl.IMPLS,
            default=None,
            help="the reference or your lab/exercises/ (default: $MINIGPT_IMPL or reference)",
        )
    p.add_argument(
        "--timeout", type=cli.SECONDS, default=launch.DEFAULT_TIMEOUT_S, help="seconds a collective may wait for a peer"
    )
    if quiet:
        p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument(
        "--report", metavar="FILE", help="write the measurements as JSON here (rank 0; default: not written)"
    )
    p.add_argument("--render", metavar="JSON", help="only render a report's tables and figures (English and Spanish)")
    if trace:
        p.add_argument(
            "--trace",
            metavar="DIR",
            help="write the PyTorch profiler's trace of a few steps, one Chrome trace JSON per rank "
            f"(DIR/{trace}-rank<r>.json.gz: open it in ui.perfetto.dev)",
        )


def check_outputs(args: argparse.Namespace) -> None:
    """``--report`` and ``--trace`` writable, or :class:`minigpt.cli.BadInput`: rank 0 writes them, and
    every rank checks them, so that every rank refuses."""
    if getattr(args, "report", None):
        cli.output_file(args.report, "--report")
    if getattr(args, "trace", None):
        cli.output_dir(args.trace, "--trace")


def add_check_flags(
    p: argparse.ArgumentParser, fp64_steps: int = proof.FP64_MIN_STEPS, check_steps: int | None = None
) -> None:
    """``--check``, ``--full`` and ``--fp64-steps`` (and, where a lab's default check trains only the
    first steps of its run, ``--check-steps``): the proof's flags, the same in every lab."""
    p.add_argument("--check", action="store_true", help="the proofs: the rulers against one process and PyTorch's own")
    p.add_argument(
        "--full",
        action="store_true",
        help="with --check: the whole stories the pages quote (every step of every comparison; long)",
    )
    p.add_argument(
        "--fp64-steps",
        type=cli.POSITIVE_INT,
        default=fp64_steps,
        help=f"--check: steps of the float64 run (at least {proof.FP64_MIN_STEPS})",
    )
    if check_steps is not None:
        p.add_argument(
            "--check-steps",
            type=cli.POSITIVE_INT,
            default=check_steps,
            help="--check: train and check the first N steps of the run's --steps (its schedule); --full: all",
        )


def placement(
    prog: str,
    args: argparse.Namespace,
    argv: list[str] | None,
    world_size: int,
    accepts: Callable[[int], object] | None = None,
    seen: launch.Seen | None = None,
) -> launch.Placement:
    """Where this machine's ranks run (:func:`minigpt.parallel.launch.place`), with the command that
    would use the GPUs when there are fewer than ranks: ``--nproc_per_node=<GPU count>`` when the lab
    runs on that many ranks (``accepts(world_size)`` returns; it raises ValueError otherwise: the
    lab's own check of its arguments), else none. :class:`minigpt.cli.BadInput` for an impossible
    request, before any process group exists."""
    seen = launch.seen_here() if seen is None else seen
    requested, source = launch.requested_device(getattr(args, "device", None))
    command = None
    gpus = seen.gpu_count if seen.cuda_available else 0
    if requested == "auto" and 0 < gpus < seen.local_ranks and accepts is not None:
        nodes = max(1, world_size // seen.local_ranks)
        try:
            accepts(gpus * nodes)
            words = " ".join(sys.argv[1:] if argv is None else argv)
            command = f"torchrun --nproc_per_node={gpus} {prog} {words}".rstrip()
            command += " (on each machine)" if nodes > 1 else ""
        except (ValueError, RuntimeError, NotImplementedError):
            command = None
    return launch.place(requested, seen, command, source)


def start(args: argparse.Namespace, where: launch.Placement, timeout_s: float | None = None) -> launch.DistContext:
    """Say where the ranks run (rank 0, one line, only when it is not the plain CPU case), join the
    process group there, and, for a ``--check``, set what the rulers need on that device
    (:func:`minigpt.parallel.proof.rulers_on`)."""
    if where.note and cli.rank_prefix() in ("", "[rank 0] "):
        print(f"[rank 0] {where.note}", flush=True)
    ctx = launch.init(args.timeout if timeout_s is None else timeout_s, where)
    if getattr(args, "check", False):
        proof.rulers_on(ctx.device)
    return ctx


def steps_trained(args: argparse.Namespace, steps: int) -> int:
    """How many of the run's ``steps`` this invocation trains: all of them, except under a default
    ``--check`` (no ``--full``) of a lab with ``--check-steps``."""
    if getattr(args, "check", False) and not getattr(args, "full", False) and getattr(args, "check_steps", None):
        return min(args.check_steps, steps)
    return steps


def check_proof_flags(args: argparse.Namespace) -> None:
    """The proof's flags together (before any process group): ``--full`` and ``--fp64-steps`` only
    mean something with ``--check``, and the float64 ruler needs its steps."""
    if getattr(args, "full", False) and not args.check:
        raise cli.BadInput("--full lengthens the proofs of --check: add --check (or leave --full out)")
    steps = getattr(args, "fp64_steps", None)
    if steps is not None and steps < proof.FP64_MIN_STEPS:
        raise cli.BadInput(
            f"--fp64-steps {steps}: the float64 ruler checks at least {proof.FP64_MIN_STEPS} steps; "
            f"give {proof.FP64_MIN_STEPS} or more"
        )


def tutor_score(model: torch.nn.Module, args: argparse.Namespace, block_size: int, ctx: launch.DistContext) -> dict:
    """The tutor's accuracy on the test split (``--test-sentences``), the same on every rank: every
    rank holds the whole trained model, so the scorer's batches are dealt out over the ranks and one
    all-reduce adds them up. Each batch is scored as one process scores it, so the numbers are one
    process's, bit for bit, in a fraction of the time (a 2-core laptop runs 4 ranks two at a time)."""
    from minigpt import grammar

    found = grammar.batch_scores(
        model, "test", args.test_sentences, block_size=block_size, mine=lambda b: b % ctx.world_size == ctx.rank
    )
    found = found.to(ctx.device)
    dist.all_reduce(found)  # each row was filled by one rank only: the sum is that rank's row, exactly
    accuracy = grammar.combine_scores(found.cpu())
    return {
        "tutor_accuracy": accuracy["accuracy"],
        "tutor_correct": accuracy["correct"],
        "tutor_total": accuracy["total"],
    }


def finish(
    report: dict,
    args: argparse.Namespace,
    ctx: launch.DistContext,
    lines_of: Callable[[dict], list[str]],
    t_start: float,
) -> dict:
    """The end every runner shares: the run's facts, rank 0's lines (``lines_of(report)``) and report
    file, and a barrier so that no rank ends (and has torchrun stop the others) before rank 0 has
    reported."""
    report.update(
        torch=torch.__version__,
        backend=ctx.backend,
        device=str(ctx.device),
        date=time.strftime("%Y-%m-%d"),
        seconds=time.perf_counter() - t_start,
        kernel_set_variables={name: os.environ.get(name) for name in kernel_sets.VARIABLES},
        cpu_capability=torch.backends.cpu.get_cpu_capability(),
    )
    if ctx.device.type == "cuda":
        report.update(gpu=torch.cuda.get_device_name(ctx.device), cuda=torch.version.cuda, **proof.cuda_settings())
    if ctx.is_main:
        for line in lines_of(report):
            launch.log(ctx, line)
        if getattr(args, "report", None):
            launch.write_report(args.report, report)
            launch.log(ctx, f"report written to {args.report}")
    dist.barrier()
    return report


def main(lab: Lab, argv: list[str] | None = None) -> int:
    """A lab script from its command line to its exit status (2: bad input; 1: a broken ruler or a
    failed run; 0: done, every criterion holding)."""
    args = lab.parse_args(argv)
    if getattr(args, "render", None):
        try:
            path = cli.input_json(args.render, "--render", lab.render_keys, lab.render_example)
        except ValueError as exc:
            return cli.refuse(lab.prog, str(exc))
        module, _, function = lab.render.partition(":")
        render = getattr(importlib.import_module(module), function)
        if lab.summary is not None:
            print("\n".join(lab.summary(json.loads(Path(path).read_text(encoding="utf-8")))))
        try:
            written = render(path)
        except cli.BadInput as exc:
            return cli.refuse(lab.prog, str(exc))
        for path in written:
            print(f"wrote {path}")
        return 0
    if getattr(args, "impl", None):
        os.environ[impl.ENV_VAR] = args.impl
    try:
        _, _, world_size = launch.torchrun_env()
        if lab.world_size is not None:
            world_size = lab.world_size()
        check_proof_flags(args)
        check_outputs(args)
        settings = lab.check_args(args, world_size)
        where = placement(lab.prog, args, argv, world_size, lambda n: lab.check_args(args, n))
    except NotImplementedError as exc:
        return cli.stop(lab.prog, f"{exc} (your code in lab/exercises/ is not written yet)")
    except (ValueError, RuntimeError) as exc:
        return cli.refuse(lab.prog, str(exc))
    ctx = start(args, where)
    report = launch.run(ctx, lab.prog, lambda: lab.measure(settings, args, ctx))
    launch.teardown()
    return 0 if report.get(lab.verdict_key, True) else 1


def one_process(
    prog: str,
    description: str,
    argv: list[str] | None,
    table: Callable[[dict, str], str],
    render_keys: tuple[str, ...],
    render_example: str,
    measure: Callable[[], dict],
) -> int:
    """The whole command line of a one-process measurement: ``--render JSON`` (the page's tables only)
    or a run on one thread, its English table printed and, with ``--report FILE``, the JSON and its
    tables (``lang.write_tables``: ``X-en.txt``, ``X-es.txt``) written; bad input refused first."""
    import platform
    import time

    from minigpt.pages.lang import write_tables

    p = cli.ArgumentParser(prog=prog, description=description)
    p.add_argument("--report", metavar="FILE", help="write the measurements as JSON here, and its table beside it")
    p.add_argument("--render", metavar="JSON", help="only render an existing result (no measuring)")
    args = p.parse_args(argv)
    try:
        if args.render:
            for written in write_tables(cli.input_json(args.render, "--render", render_keys, render_example), table):
                print(f"wrote {written}")
            return 0
        if args.report is not None:
            cli.output_file(args.report, "--report")
    except cli.BadInput as exc:
        return cli.refuse(prog, str(exc))
    torch.set_num_threads(1)
    report = {
        "device": f"{platform.processor() or platform.machine()}, one thread",
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        **measure(),
    }
    print(table(report, "en"), flush=True)
    if args.report:
        launch.write_report(args.report, report)
        for written in [args.report, *write_tables(args.report, table)]:
            print(f"wrote {written}")
    return 0
