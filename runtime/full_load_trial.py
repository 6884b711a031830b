"""A trial at all of the load: the canary beside a single replica takes every new request, and
the replica, idle but warm, is the way back.

Why: a canary at half the traffic runs at a small batch, and what decides near capacity (the
speculative path at the batch the whole load drives it to) is not measured there; the tuner's
judge, extrapolating from it, put the same capacity over need (0.9 to 1.03) on the worlds
where EAGLE-3 holds 0.7 of capacity and on those where it does not
(`git show 243d7a9:bench/results/ablations-poisson-vllm-exploration.json`). At all of the
load the canary shows it directly, and a warm replica makes the way back a routing change,
not an engine start.

Contract (pure; both actuators, `EmulatedDeployment` and `KubeActuator`, drive it):
- `time_in_system(observation)`: Little's law on one window, requests in flight (running plus
  waiting) over requests finished per second; None without finished requests.
- `FullLoadTrial(reference)`, `reference` the replica's last window before the trial:
  `overloaded(probe, elapsed_s)` says why to stop now, once a request has stayed longer on
  the canary than on the replica by more than `overload_tolerance` at two probes running
  after `settle_s` (time in system, not requests in flight: bursty traffic moves the
  arrivals between the replica's window and the trial's, and in flight moves with them);
  `verdict(canary_window)` says why the canary is not promoted (None: it is): its time in
  system over the trial must be below the replica's by `required_gain`.
"""

from __future__ import annotations

from dataclasses import dataclass

from specpilot.tuner import Observation

PROBE_S = 5.0
"""How often the canary's time in system is read during the trial."""
SETTLE_S = 10.0
"""Left alone after the switch: the canary's first requests of all of the load are still
coming in while the replica's last ones leave."""
OVERLOAD_TOLERANCE = 0.2
"""A longer stay than on the replica by this much, twice running, stops the trial: a 5 s
probe at 15 requests/s sees about 75 finish, a swing of about 12% on its own. In the
exploration ablations (bench/results/ablations-*-exploration.json, at c51c1ca) 47 trials
were stopped, a median 45 s in (15 to 295), at a median +50% (+21% to +1150%)."""
REQUIRED_GAIN = 0.1
"""The time in system the canary must save over the replica's to be promoted: a config a few
percent faster at this load is the one that congests first when it rises."""
WINDOW_S = 300.0
"""How long the canary serves all of the load: the congestion episodes that decide near
capacity come every few minutes, not in every window (static EAGLE-3 K=3, world 4 at 0.7 of
capacity: 0.67x to 1.67x of no speculation's mean E2E from one 60 s window to another,
bench/results/yardstick-poisson-vllm.json)."""


def in_flight(observation: Observation) -> float | None:
    """Requests running plus waiting over the window (per engine)."""
    if observation.running_requests is None:
        return None
    return observation.running_requests + (observation.waiting_requests or 0.0)


def time_in_system(observation: Observation) -> float | None:
    """Little's law: the mean seconds a request stays, in flight over finished per second."""
    held, rate = in_flight(observation), observation.requests_per_s
    if held is None or not rate:
        return None
    return held / rate


@dataclass(slots=True)
class FullLoadTrial:
    reference: Observation
    """The replica's last window before the trial, at the same traffic."""
    settle_s: float = SETTLE_S
    overload_tolerance: float = OVERLOAD_TOLERANCE
    required_gain: float = REQUIRED_GAIN
    _above: int = 0

    def overloaded(self, probe: Observation, elapsed_s: float) -> str | None:
        """Why to stop the trial now, given the canary's last probe window."""
        mine, theirs = time_in_system(probe), time_in_system(self.reference)
        if mine is None or not theirs or elapsed_s < self.settle_s:
            return None
        if mine <= theirs * (1.0 + self.overload_tolerance):
            self._above = 0
            return None
        self._above += 1
        if self._above < 2:
            return None
        return (
            f"at all of the load a request stayed {mine:.2f} s against {theirs:.2f} s on the "
            f"replica before it ({mine / theirs - 1:+.0%}) after {elapsed_s:.0f} s: congested, "
            "stopped"
        )

    def verdict(self, canary: Observation) -> str | None:
        """Why the canary is not promoted after the whole trial, or None when it is."""
        mine, theirs = time_in_system(canary), time_in_system(self.reference)
        if mine is None or theirs is None:
            return f"no load to compare (canary {mine}, replica {theirs} s in system)"
        if mine > theirs * (1.0 - self.required_gain):
            return (
                f"at all of the load a request stayed {mine:.2f} s against {theirs:.2f} s on "
                f"the replica before it ({mine / theirs - 1:+.0%}; "
                f"{self.required_gain:.0%} less needed)"
            )
        return None
