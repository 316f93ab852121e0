"""Lab 03, part 3: FSDP in practice. Eight demonstrations on real FSDP2 runs of MiniGPT.

    torchrun --nproc_per_node=2 lab/03_fsdp_practice.py                        # all eight
    torchrun --nproc_per_node=2 lab/03_fsdp_practice.py --only wrap,clipping   # some
    torchrun --nproc_per_node=2 lab/03_fsdp_practice.py --steps 20 --report lab/results/03-practice-cpu.json
    python lab/03_fsdp_practice.py --render lab/results/03-practice-cpu.json   # tables and figures, en + es

Demonstrations (``--only``): wrap, mixed-precision, activation-checkpointing, checkpoint,
clipping, diagnostics, loading (a full checkpoint into shards: FSDP-first, then broadcast from
rank 0), failed-save (a collective save that one rank never joins, ended by a short timeout).
Rank 0 prints a table for each. The code that measures lives in minigpt/fsdp/ (practice.py,
sharded_state.py, memory.py, loading.py, export.py, failed_save.py); this file runs it, and
minigpt/pages/lab03_practice.py draws its tables and figures.

The checkpoint demonstration has two halves. The 2 ranks save a sharded checkpoint in
``--out-dir``; when they have left the process group, rank 0 starts a *new process*, a world of
one, that reads it back into a plain MiniGPT:

    python lab/03_fsdp_practice.py --load-resharded out/lab03-checkpoints

(the command is printed, so you can run it again yourself). That process also consolidates the
sharded checkpoint into one ``torch.save`` file, ``consolidated.pt``, for export (the ``export``
section of the report). Starting it from here keeps the
demonstration one command and its numbers in the same report; starting a new process, without
torchrun's environment, shows that nothing of the 2-rank run is needed to read its checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from minigpt import cli
from minigpt.pages.lab03_practice import DEMOS, TABLES, render, table_export, table_load

PROG = "lab/03_fsdp_practice.py"
SCRIPT = Path(__file__).resolve().parent.parent.parent / PROG  # the lab script, started again for the world-1 load
DEFAULT_OUT_DIR = "out/lab03-checkpoints"
STEPS = cli.Number(int, low=2, note="a median and a drift need two steps")
FAILED_SAVE_TIMEOUT_S = 5.0  # the failed-save demonstration's own group: what its rank waits
TORCHRUN_ENV = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "GROUP_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = cli.torchrun_parser(PROG, __doc__, nproc="2")
    p.add_argument(
        "--only",
        default=",".join(DEMOS),
        metavar="NAME[,NAME]",
        help=f"demonstrations to run, from: {', '.join(DEMOS)}",
    )
    p.add_argument(
        "--steps",
        type=STEPS,
        default=10,
        help="training steps each demonstration takes (counted, timed, or trained before the drift is measured)",
    )
    p.add_argument("--seed", type=cli.SEED, default=0, help="initial weights and batches")
    p.add_argument(
        "--batch-size", type=cli.POSITIVE_INT, default=64, help="global batch (sentences), cut evenly over the ranks"
    )
    p.add_argument("--report", metavar="FILE.json", help="write every measured number as JSON (rank 0)")
    p.add_argument(
        "--out-dir",
        default=DEFAULT_OUT_DIR,
        help="the checkpoint folder the checkpoint demonstration writes: a new one is written beside it, "
        "then replaces it whole (created if missing)",
    )
    p.add_argument("--timeout", type=cli.SECONDS, default=60.0, help="seconds a collective may wait for a peer")
    p.add_argument(
        "--render",
        metavar="FILE.json",
        help="only write the tables (FILE-en.txt, FILE-es.txt) "
        "and figures (FILE-*-en.png, -es.png) of a report; measures nothing",
    )
    p.add_argument(
        "--load-resharded",
        metavar="DIR",
        help="(the world-1 half) read the sharded "
        "checkpoint in DIR into a plain MiniGPT and compare; run with plain python",
    )
    cli.add_device_flag(p)
    return p.parse_args(argv)


def check_args(args: argparse.Namespace) -> list[str]:
    """The demonstrations to run, or ValueError naming the value that cannot work (the numbers were
    checked by their rules when parsed; the launcher's environment and the world size here)."""
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in DEMOS]
    if unknown or not names:
        raise ValueError(
            f"--only {args.only!r}: unknown demonstration {', '.join(unknown) or '(none given)'}; "
            f"choose from {', '.join(DEMOS)}"
        )
    _, _, world_size = cli.launcher_env()  # what launch.torchrun_env reads, without importing torch
    if args.load_resharded and world_size != 1:  # what the folder holds is checked when it is read
        raise cli.BadInput(
            f"--load-resharded {args.load_resharded}: reads the checkpoint in a world of one; run it with "
            f"plain python, not under torchrun (WORLD_SIZE={world_size})"
        )
    if args.report:  # rank 0 writes the report; every rank checks it, so that every rank refuses
        cli.output_file(args.report, "--report")
    out_dir = Path(args.out_dir)
    if not args.load_resharded and not args.render:  # every rank writes its shards there
        cli.output_dir(out_dir, "--out-dir")
    if "checkpoint" in names and not args.load_resharded and not args.render:
        check_out_dir(args.out_dir)
    if args.report and Path(args.report).suffix != ".json":
        raise ValueError(f"--report {args.report}: the report is JSON; give a file name ending in .json")
    if args.render:
        cli.input_json(args.render, "--render", ("meta",), "lab/results/03-practice-cpu.json")
    elif not args.load_resharded:  # the values given are valid: can this world run them?
        world_check(args, world_size)
    return [n for n in DEMOS if n in names]


def world_check(args: argparse.Namespace, world_size: int) -> None:
    """Can a world of ``world_size`` ranks run the demonstrations? (BadInput otherwise.)"""
    cli.need_world_size(world_size, 2, "FSDP shards across ranks")
    cli.divisible_by_world("--batch-size", args.batch_size, world_size)


def check_out_dir(value: str) -> None:
    """The checkpoint demonstration replaces ``--out-dir`` as a whole (the new checkpoint is
    written beside it, then swapped in: :mod:`minigpt.checkpoints`), so the folder must hold
    nothing but an earlier checkpoint, and the folder around it must take new files."""
    out_dir = Path(value)
    if out_dir.is_dir() and any(out_dir.iterdir()):
        from minigpt import checkpoints
        from minigpt.fsdp.sharded_state import REPLACEABLE

        try:
            checkpoints.replaceable(out_dir, REPLACEABLE)
        except checkpoints.CheckpointError as exc:
            raise ValueError(f"--out-dir {value}: {exc}") from None
    if out_dir.exists():
        try:
            cli.output_dir(out_dir.resolve().parent, "--out-dir")
        except cli.BadInput:
            raise ValueError(
                f"--out-dir {value}: the folder it is in, {out_dir.resolve().parent}, is not writable, "
                f"and the new checkpoint is written there, beside the old one, before it replaces it"
            ) from None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        names = check_args(args)
    except ValueError as exc:
        return cli.refuse(PROG, str(exc))
    if args.render:
        for path in render(Path(args.render)):
            print(f"wrote {path}")
        return 0
    from minigpt.parallel import launch
    from minigpt.runners import entry

    if args.load_resharded:
        return load_half(args)
    try:
        _, _, world_size = launch.torchrun_env()
        where = entry.placement(PROG, args, argv, world_size, lambda n: world_check(args, n))
    except ValueError as exc:
        return cli.refuse(PROG, str(exc))
    ctx = entry.start(args, where)
    report = launch.run(ctx, PROG, lambda: run(names, args, ctx))
    launch.teardown()
    if ctx.rank != 0:
        return 0
    if "checkpoint" in names:
        report["checkpoint"]["load"] = start_load_half(args)
        if "export" in report["checkpoint"]["load"]:  # a section of its own on the page
            report["export"] = report["checkpoint"]["load"].pop("export")
    if args.report:
        launch.write_report(args.report, report)
        print(f"[rank 0] wrote {args.report}")
    ok = "checkpoint" not in names or (
        report["checkpoint"]["load"].get("max_logit_difference") == 0.0
        and report.get("export", {}).get("identical_logits") is True
    )
    if "loading" in names:  # the loaded shards are the checkpoint, bit for bit
        ok = ok and all(report["loading"][k]["max_difference"] == 0.0 for k in ("fsdp_first", "broadcast_from_rank0"))
    return 0 if ok else 1


def run(names: list[str], args: argparse.Namespace, ctx) -> dict:
    import torch

    from minigpt.fsdp import failed_save, practice, sharded_state
    from minigpt.parallel import launch
    from minigpt.train import TrainConfig

    cfg = TrainConfig(seed=args.seed, batch_size=args.batch_size, steps=max(50, 2 * args.steps))
    demos = {
        "wrap": lambda: practice.wrap_policies(cfg, ctx, args.steps),
        "mixed-precision": lambda: sharded_state.mixed_precision(cfg, ctx, args.steps),
        "activation-checkpointing": lambda: practice.activation_checkpointing(cfg, ctx, args.steps),
        "checkpoint": lambda: {"save": sharded_state.save_checkpoints(cfg, ctx, args.out_dir, args.steps)},
        "clipping": lambda: sharded_state.gradient_clipping(cfg, ctx, args.steps),
        "diagnostics": lambda: practice.diagnostics(cfg, ctx),
        "loading": lambda: loading_demo(cfg, ctx),
        "failed-save": lambda: failed_save.failed_save(ctx, FAILED_SAVE_TIMEOUT_S),
    }
    report = {
        "meta": {
            "world_size": ctx.world_size,
            "backend": ctx.backend,
            "device": str(ctx.device),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "steps": args.steps,
            "seed": args.seed,
            "batch_size": cfg.batch_size,
            "demonstrations": names,
        }
    }
    launch.log(
        ctx,
        f"MiniGPT, world size {ctx.world_size} ({ctx.backend}), FSDP2 fully_shard, "
        f"{args.steps} steps per demonstration, seed {args.seed}",
    )
    for name in names:
        t0 = time.perf_counter()
        report[name] = demos[name]()
        if ctx.is_main:
            print(f"\n## {name} ({time.perf_counter() - t0:.1f} s)\n\n{TABLES[name](report[name], 'en')}", flush=True)
    return report


def loading_demo(cfg, ctx) -> dict:
    """A full checkpoint (``torch.save`` of a plain MiniGPT) loaded into FSDP shards twice: every
    rank reading it, then rank 0 only. Each rank writes the file in a temporary folder of its own
    (ranks on other machines need no shared disk) and removes it after."""
    import tempfile

    from minigpt.fsdp import loading

    with tempfile.TemporaryDirectory(prefix="minigpt-full-") as folder:
        path = Path(folder) / "full.pt"
        file_bytes = loading.write_full_checkpoint(cfg, path)
        return {
            "file_bytes": file_bytes,
            "fsdp_first": loading.fsdp_first_loading(cfg, ctx, path),
            "broadcast_from_rank0": loading.cpu_ram_efficient_loading(cfg, ctx, path),
        }


def load_half(args: argparse.Namespace) -> int:
    """The world-1 half: read the sharded checkpoint, compare, print, write DIR/load-report.json."""
    import torch

    from minigpt.fsdp import export, sharded_state
    from minigpt.parallel import launch
    from minigpt.train import TrainConfig

    torch.set_num_threads(1)  # the kernels the saving ranks ran (torchrun gives each rank one thread)
    # a world of one that reads the shards from disk into CPU memory: the CPU, whatever --device says
    ctx = launch.init(args.timeout, launch.Placement("gloo", "cpu"))
    try:
        result = sharded_state.load_resharded(TrainConfig(seed=args.seed), args.load_resharded)
        folder = Path(args.load_resharded)
        result["export"] = export.consolidate(
            TrainConfig(seed=args.seed),
            folder / sharded_state.SHARDED_DIR,
            torch.load(folder / sharded_state.PROBE_FILE, weights_only=True),
            folder / export.CONSOLIDATED_FILE,
        )
    except ValueError as exc:  # a missing or inconsistent checkpoint: one line, naming the file
        return cli.refuse(PROG, str(exc))
    finally:
        launch.teardown()
    result["world_size"] = ctx.world_size
    print(table_load(result, "en"), flush=True)
    print(table_export(result["export"], "en"), flush=True)
    (Path(args.load_resharded) / sharded_state.LOAD_REPORT).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["max_logit_difference"] == 0.0 and result["export"]["identical_logits"] else 1


def start_load_half(args: argparse.Namespace) -> dict:
    """Rank 0, after the process group is gone: run the world-1 half in a new process."""
    from minigpt.fsdp.sharded_state import LOAD_REPORT

    command = [sys.executable, str(SCRIPT), "--load-resharded", args.out_dir, "--seed", str(args.seed)]
    print(
        f"\n## checkpoint, second half: a new process, world size 1\n\n$ python {PROG} "
        f"--load-resharded {args.out_dir}" + (f" --seed {args.seed}" if args.seed else ""),
        flush=True,
    )
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_ENV and not k.startswith("TORCHELASTIC")}
    report_file = Path(args.out_dir) / LOAD_REPORT
    report_file.unlink(missing_ok=True)  # from an earlier run
    done = subprocess.run(command, env=env, timeout=300)
    if done.returncode not in (0, 1) or not report_file.exists():
        return {"error": f"the world-1 load exited with code {done.returncode}"}
    return json.loads(report_file.read_text())
