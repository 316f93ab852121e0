"""A small multilayer perceptron in numpy: the model the ZeRO simulator trains.

Each layer is one *unit*: its weight matrix W (fan_in x fan_out) and bias b, stored together as
one flat vector [W.ravel(), b], the way ZeRO and FSDP flatten a unit's parameters before cutting
them into shards. Hidden layers use tanh; the loss is half the mean squared error over the
global batch, so that averaging the workers' gradients gives exactly the gradient of the
whole batch when every worker holds the same number of rows.

Forward and backward are written out by hand, layer by layer, because the simulator has to act
between layers (gather a unit's weights just before it runs, scatter its gradient just after).
Arithmetic is float32 whatever the storage precision, so every ZeRO stage computes the same
numbers in the same order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

COMPUTE = np.float32


@dataclass(frozen=True)
class MLPSpec:
    """Layer widths, input first: (16, 32, 32, 8) is three units 16->32->32->8."""

    widths: tuple[int, ...] = (16, 32, 32, 8)

    def __post_init__(self):
        if len(self.widths) < 2 or any(not isinstance(w, int) or w < 1 for w in self.widths):
            raise ValueError(f"widths must be >= 2 positive integers, got {self.widths!r}")

    @property
    def shapes(self) -> list[tuple[int, int]]:
        return list(zip(self.widths[:-1], self.widths[1:]))

    @property
    def unit_sizes(self) -> list[int]:
        return [fan_in * fan_out + fan_out for fan_in, fan_out in self.shapes]

    @property
    def n_params(self) -> int:
        return sum(self.unit_sizes)


def init_units(spec: MLPSpec, seed: int = 0) -> list[np.ndarray]:
    """One flat float32 vector per unit, scaled like PyTorch's default Linear initialisation."""
    rng = np.random.default_rng(seed)
    units = []
    for fan_in, fan_out in spec.shapes:
        bound = 1 / np.sqrt(fan_in)
        units.append(rng.uniform(-bound, bound, fan_in * fan_out + fan_out).astype(COMPUTE))
    return units


def split(unit: np.ndarray, fan_in: int, fan_out: int) -> tuple[np.ndarray, np.ndarray]:
    """(W, b) views of a unit's flat vector (padding at the end, if any, is ignored)."""
    w = unit[: fan_in * fan_out].reshape(fan_in, fan_out)
    return w, unit[fan_in * fan_out : fan_in * fan_out + fan_out]


def forward_unit(x: np.ndarray, unit: np.ndarray, fan_in: int, fan_out: int, last: bool) -> np.ndarray:
    """y = tanh(x W + b), or x W + b for the last layer."""
    w, b = split(unit.astype(COMPUTE, copy=False), fan_in, fan_out)
    z = x @ w + b
    return z if last else np.tanh(z)


def backward_unit(
    dy: np.ndarray, x: np.ndarray, y: np.ndarray, unit: np.ndarray, fan_in: int, fan_out: int, last: bool
) -> tuple[np.ndarray, np.ndarray]:
    """From dL/dy of a layer (its input x and output y kept from forward): dL/dx and the unit's
    flat gradient [dW.ravel(), db] (unpadded)."""
    w, _ = split(unit.astype(COMPUTE, copy=False), fan_in, fan_out)
    dz = dy if last else dy * (1 - y * y)  # tanh' = 1 - tanh^2
    grad = np.concatenate([(x.T @ dz).ravel(), dz.sum(axis=0)])
    return dz @ w.T, grad


def loss_and_grad(out: np.ndarray, target: np.ndarray, global_rows: int) -> tuple[float, np.ndarray]:
    """Half mean squared error of these rows' share of a batch of ``global_rows`` rows, and its
    gradient with respect to ``out``."""
    diff = out - target
    return float(0.5 * (diff * diff).sum() / global_rows), diff / global_rows


def make_batch(spec: MLPSpec, step: int, rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The global batch of ``step``: inputs and the targets of a fixed random "teacher" map."""
    teacher = np.random.default_rng(10_000 + seed).standard_normal((spec.widths[0], spec.widths[-1]))
    teacher /= np.sqrt(spec.widths[0])  # x @ teacher of unit variance: a smooth, learnable map
    rng = np.random.default_rng([seed, step])
    x = rng.standard_normal((rows, spec.widths[0])).astype(COMPUTE)
    return x, np.sin(x @ teacher).astype(COMPUTE)
