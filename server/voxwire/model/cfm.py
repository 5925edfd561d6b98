"""The conditional flow-matching sampler (``feat_decoder``): Euler steps with a sway time schedule,
classifier-free guidance with CFG-Zero* scaling, and a per-row guidance strength.

Rows may use different numbers of timesteps in one call: every row gets its own time grid (padded to
the longest), and a row whose grid is exhausted is masked (its sample stops changing). All rows then
run the same number of estimator calls, so one call has one static shape. The noise is an input, not
drawn here, so a caller controls each row's random stream (the seed contract) and a CUDA graph can
capture the whole sampler.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from voxwire.model.local_dit import VoxCPMLocDiT


def time_grid(steps: int, dtype: torch.dtype, device: torch.device, sway: float = 1.0) -> torch.Tensor:
    """(steps+1,) times from 1 (noise) to 0 (data) with sway sampling, computed in ``dtype`` like the reference."""
    t = torch.linspace(1, 0, steps + 1, device=device, dtype=dtype)
    return t + sway * (torch.cos(torch.pi / 2 * t) - 1 + t)


def zero_init_steps(steps: int) -> int:
    """CFG-Zero*: how many leading Euler steps keep the sample equal to the noise."""
    return max(1, int((steps + 1) * 0.04))


@dataclass(frozen=True)
class CfmSchedule:
    """Per-row time grids of a batch, with the Euler recurrence's times already unrolled.

    ``times[:, k]`` and ``deltas[:, k]`` are the t and dt that Euler step k+1 uses, produced by the
    reference's own recurrence (``t -= dt; dt = t - grid[k+1]``, in the model dtype), so they are the
    exact values the reference feeds its estimator. Rows shorter than the longest are padded.
    """

    times: torch.Tensor  # (B, S)
    deltas: torch.Tensor  # (B, S)
    steps: torch.Tensor  # (B,) long: each row's number of Euler steps
    zero_init: torch.Tensor  # (B,) long: each row's CFG-Zero* step count
    max_steps: int  # S, the longest row
    uniform_zero_init: int  # steps every row skips (the minimum over rows)
    ragged: bool  # rows differ in steps or zero-init counts, so masking is needed

    @classmethod
    def build(cls, steps_per_row: list[int], dtype: torch.dtype, device: torch.device) -> CfmSchedule:
        longest = max(steps_per_row)
        grids = {n: time_grid(n, dtype, device) for n in set(steps_per_row)}
        t_span = torch.stack([torch.cat([grids[n], grids[n][-1:].expand(longest - n)]) for n in steps_per_row])
        t, dt = t_span[:, 0], t_span[:, 0] - t_span[:, 1]
        times, deltas = [t], [dt]
        for step in range(1, longest):
            t = t - dt
            dt = t - t_span[:, step + 1]
            times.append(t)
            deltas.append(dt)
        zero = [zero_init_steps(n) for n in steps_per_row]
        return cls(
            times=torch.stack(times, dim=1),
            deltas=torch.stack(deltas, dim=1),
            steps=torch.tensor(steps_per_row, device=device),
            zero_init=torch.tensor(zero, device=device),
            max_steps=longest,
            uniform_zero_init=min(zero),
            ragged=len(set(steps_per_row)) > 1,
        )


class UnifiedCFM(nn.Module):
    def __init__(self, estimator: VoxCPMLocDiT, mean_mode: bool) -> None:
        super().__init__()
        self.estimator = estimator
        self.mean_mode = mean_mode

    def forward(
        self,
        noise: torch.Tensor,
        mu: torch.Tensor,
        cond: torch.Tensor,
        cfg_value: torch.Tensor,
        schedule: CfmSchedule,
    ) -> torch.Tensor:
        """noise (B, D, P) in the model dtype, mu (B, Hmu), cond (B, D, P) previous patch,
        cfg_value (B,) float32 -> sampled patch (B, D, P)."""
        batch, steps = noise.size(0), schedule.max_steps
        estimator = self.estimator
        # Time embeddings and the cond tokens do not depend on x: one estimator pass for all steps instead
        # of one per step (the reference recomputes them at every step, with the same values).
        step_dt = schedule.deltas if self.mean_mode else torch.zeros_like(schedule.deltas)
        time = estimator.time_embedding(schedule.times.reshape(-1), step_dt.reshape(-1)).view(batch, steps, -1)
        cond_tokens = estimator.cond_tokens(cond)
        both_mu = torch.cat([mu, torch.zeros_like(mu)])  # the unconditional half zeroes mu only
        sequence = estimator.sequence(both_mu, torch.cat([cond_tokens, cond_tokens]))
        x = noise
        for step in range(1, steps + 1):
            # A CFG-Zero* step every row skips leaves x unchanged (x - dt*0), so it is not computed.
            if step <= schedule.uniform_zero_init:
                continue
            both_time = torch.cat([time[:, step - 1], time[:, step - 1]])
            velocity = self._guided_velocity(x, both_mu, both_time, sequence, cfg_value)
            updated = x - schedule.deltas[:, step - 1, None, None] * velocity
            if schedule.ragged:
                active = (step > schedule.zero_init) & (step <= schedule.steps)
                updated = torch.where(active[:, None, None], updated, x)
            x = updated
        return x

    def _guided_velocity(
        self,
        x: torch.Tensor,
        both_mu: torch.Tensor,
        both_time: torch.Tensor,
        sequence: torch.Tensor,
        cfg_value: torch.Tensor,
    ) -> torch.Tensor:
        """One estimator call on 2B rows (conditional, then unconditional), combined with CFG-Zero*."""
        batch = x.size(0)
        both = self.estimator.velocity(torch.cat([x, x]), both_mu, both_time, sequence)
        conditional, unconditional = both[:batch], both[batch:]
        flat_c, flat_u = conditional.reshape(batch, -1), unconditional.reshape(batch, -1)
        dot = torch.sum(flat_c * flat_u, dim=1, keepdim=True)
        scale = (dot / (torch.sum(flat_u**2, dim=1, keepdim=True) + 1e-8)).view(batch, 1, 1)
        # cfg_value is fp32: the product is rounded once to the model dtype, as a Python-float scalar is.
        guided = (cfg_value.view(batch, 1, 1) * (conditional - unconditional * scale)).to(x.dtype)
        return unconditional * scale + guided
