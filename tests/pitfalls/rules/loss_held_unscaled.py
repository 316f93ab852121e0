"""Exercise 6.2: The loss held unscaled."""

from __future__ import annotations


def forward_step(stage, i: int, batches, link, held: dict, scale: float):
    inputs = batches.tokens[i] if stage.is_first else link.recv_activation(i).requires_grad_()
    outputs = stage(inputs)
    if stage.is_last:
        loss = stage.loss(outputs, batches.targets[i], batches.masks[i])
        held[i] = (None if stage.is_first else inputs, loss)  # Mistake: loss * scale is what backward needs
        return loss.item()
    link.send_activation(outputs.detach(), i)
    held[i] = (None if stage.is_first else inputs, outputs)
    return None
