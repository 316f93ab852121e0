"""MiniGPT itself: size, the choices the labs rely on, determinism, greedy generation."""

from __future__ import annotations

import torch

from minigpt import grammar
from minigpt.model import GPTConfig, MiniGPT
from minigpt.train import TrainConfig, build_model


def test_default_size_is_about_half_a_million_parameters():
    model = MiniGPT(GPTConfig())
    assert GPTConfig().vocab_size == grammar.VOCAB_SIZE
    n = model.num_params()
    # counted by hand: 4 blocks x 111,456 + token 609x96 + position 32x96 + final norm 192
    assert n == 4 * 111_456 + 609 * 96 + 32 * 96 + 192 == 507_552


def test_embeddings_are_tied_and_attention_has_no_bias():
    model = MiniGPT(GPTConfig())
    assert model.lm_head.weight is model.wte.weight
    assert sum(1 for p in model.parameters() if p is model.wte.weight) == 1, "counted once"
    for block in model.blocks:
        assert block.attn.qkv.bias is None and block.attn.proj.bias is None
    assert not any("attn" in name and name.endswith("bias") for name, _ in model.named_parameters())


def test_initial_logits_are_of_order_one():
    model = build_model(TrainConfig())
    x, y, mask = grammar.get_batch("train", 0, 64)
    with torch.no_grad():
        logits, loss = model(x, y, mask)
    assert 0.05 < logits.std() < 1.0 and logits.abs().max() < 5
    # an untrained model is close to uniform over the vocabulary: loss ~ ln(609) = 6.41
    assert abs(float(loss) - torch.log(torch.tensor(609.0)).item()) < 0.1


def test_same_seed_same_weights_other_seed_other_weights():
    a, b = build_model(TrainConfig(seed=7)), build_model(TrainConfig(seed=7))
    c = build_model(TrainConfig(seed=8))
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not torch.equal(a.wte.weight, c.wte.weight)


def test_generate_matches_step_by_step_argmax():
    """Batched greedy decoding with prompts of different lengths gives, for each prompt, the
    same tokens as decoding that prompt alone one token at a time."""
    torch.manual_seed(0)
    model = MiniGPT(GPTConfig(vocab_size=30, block_size=16, n_layer=2, n_head=2, n_embd=16)).eval()
    prompts = [[1, 5, 7], [1, 9, 4, 8, 2], [1]]
    batched = model.generate(prompts, eos_id=3, max_new_tokens=6)
    for prompt, got in zip(prompts, batched):
        seq = list(prompt)
        for _ in range(6):
            with torch.no_grad():
                logits, _ = model(torch.tensor([seq]))
            seq.append(int(logits[0, -1].argmax()))
            if seq[-1] == 3:
                break
        assert got == seq[len(prompt) :]
