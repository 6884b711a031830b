"""The policy: each tick, stay or switch (method, K, schedule, or speculation off).

Contract: `decide(observation, state, settings, cost, now)` is pure: it returns a `Decision`
and the next `TunerState`, and reads no clock (time is `now`, seconds). It
- holds when the observation lacks the load or throughput it needs (never guesses);
- learns from the running config: its method's acceptance (blended into the estimate), the
  hardware step-time factor, and the residual of measured over prior throughput;
- scores every candidate at the current load with the surrogate, drops those predicted to
  break the SLO (per-token latency p95, via the predicted TPOT), and switches only when the
  predicted gain over the expected dwell beats the restart cost plus hysteresis, after the
  minimum dwell and within the restart budget; under an SLO the restart cost includes the
  backlog its downtime leaves, when draining it at max-num-seqs would break the SLO;
- explores, when nothing is predicted better on the mean, the candidate with the largest
  expected improvement (its predicted throughput taken as log-normal with the surrogate's
  uncertainty) whose pessimistic prediction is within `max_downside` of the current config,
  if that improvement over the dwell pays for the restart (and the one undoing a failed
  trial would cost); on a canary (`trial_share` below 1) the loss counts at the canary's
  share of the traffic, `learn_trial` folds what the canary served into the state, and
  `judge_trial` promotes the canary only if, with that learned, the tuner would move to its
  config (to another config of its method: that move instead, `TrialVerdict.instead`).
Every decision carries a one-line reason, the predicted gain and the regime.

One tick is three steps, each its own module, composed by `decision.decide`:
- `learn`: fold the window into the state (acceptance, traffic, load trend, throughput
  residual) and build the surrogate the rest of the tick predicts with;
- `propose`: score the space, plan ahead when the load moves (`plan`), explore: which config
  would be best, and why;
- `gate`: dwell, restart budget, hysteresis and what a restart costs (`costs`): whether to act.
`settings` holds `TunerSettings`.
"""

from __future__ import annotations

from specpilot.tuner.policy.decision import Action, Decision, TrialVerdict, decide, judge_trial
from specpilot.tuner.policy.learn import learn_trial
from specpilot.tuner.policy.settings import DEFAULT_MAX_BATCH, TunerSettings

__all__ = [
    "DEFAULT_MAX_BATCH",
    "Action",
    "Decision",
    "TrialVerdict",
    "TunerSettings",
    "decide",
    "judge_trial",
    "learn_trial",
]
