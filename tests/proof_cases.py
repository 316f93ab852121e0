"""Broken systems for the proof harness's own test: ``python tests/proof_cases.py OUT.json`` in a world
of one process (tests/test_proof.py). Each case is a one-process MiniGPT with one classic mistake put
in by hand; the harness must measure it with the ruler that is meant to catch it."""

from __future__ import annotations

import json
import sys
from dataclasses import replace

import torch

from minigpt import grammar
from minigpt.parallel import launch, proof
from minigpt.train import TrainConfig, build_model, build_optimizer, train_step

CFG = TrainConfig(n_layer=1, steps=12, warmup=2)


class OneProcess:
    """A world of one as a :class:`~minigpt.parallel.proof.System`, with an optional mistake applied to
    the gradients after backward (``hook(model)``)."""

    def __init__(self, cfg: TrainConfig, hook=None):
        self.cfg, self.hook = cfg, hook
        self.model = build_model(cfg)
        self.optimizer = build_optimizer(self.model, cfg)
        self.norm = proof.run_norm_capture(self.model, self.optimizer)
        if hook is not None:
            for p in self.model.parameters():
                p.register_post_accumulate_grad_hook(lambda p, hook=hook: hook(p, self.model))

    def train_step(self, step: int):
        return train_step(self.model, self.optimizer, step, self.cfg), self.norm()

    def whole_state(self) -> dict:
        return proof.plain_state(self.model, self.optimizer)

    def first_step(self) -> proof.FirstStep:
        x, y, mask = grammar.get_batch(
            "train", 0, self.cfg.batch_size, seed=self.cfg.seed, block_size=self.cfg.block_size
        )
        logits, loss = self.model(x, y, mask)
        loss.backward()
        return proof.FirstStep(slice(None), logits.detach(), {n: p.grad for n, p in self.model.named_parameters()})


def doubled(p, model):  # DDP's classic: the sum over two ranks, never divided by the world size
    p.grad.mul_(2)


def one_lost(p, model):  # a reduce forgotten for one bucket: the last block's MLP keeps half its gradient
    if p is model.blocks[-1].mlp.fc.weight:
        p.grad.mul_(0.5)


def measure(name: str, hook, cfg: TrainConfig, ctx) -> dict:
    check = proof.Proof(proof.DATA_PARALLEL, twin_norm="run")
    build = lambda c: OneProcess(c, hook)  # noqa: E731
    check.first_step(build, cfg, ctx)
    check.float64(build, cfg, ctx, 3)
    check.float32(proof.run_with_twin(build(cfg), cfg, ctx, twin_norm="run", steps=3))
    verdict = check.judge()
    return {**check.report, **verdict.keys(), "lines": verdict.lines()}


def main() -> None:
    ctx = launch.init()
    out = {
        "honest": measure("honest", None, CFG, ctx),
        "doubled_sgd": measure(
            "doubled", doubled, replace(CFG, optimizer="sgd", lr=0.1, min_lr=0.0, grad_clip=0.0), ctx
        ),
        "one_lost": measure("one lost", one_lost, CFG, ctx),
    }
    v = proof.Verdict()
    v.equal("bytes_per_rank_per_step", 2_922_000, 2_922_240, "Lab 02's model")
    v.true("same_as_pytorch", False, "bit-identical to FSDP2")
    v.reported("pytorch_fp32_max_step_drift", 1.2e-4)
    out["verdict"] = {**v.keys(), "lines": v.lines()}
    with open(sys.argv[1], "w") as f:
        json.dump(out, f)
    launch.teardown()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
