"""specpilot.tuner: pure decision logic (no Kubernetes, no HTTP, no clock).

This is the tuner's public face: callers import from here, never from the private maths in
`specpilot.tuner._model` (acceptance chains, the roofline, step cost, the surrogate, schedule
synthesis), the way Optuna keeps its `_gp/` apart from the samplers. Inside the tuner, modules
import each other by their own paths.

It also publishes the priors (`specpilot.tuner.priors`): per method x task acceptance from
published numbers, and the task names; the emulator draws its hidden world around them.
"""

from specpilot.tuner._model.acceptance import AcceptanceCurve, p_for_length
from specpilot.tuner._model.hardware import (
    GPUS,
    PROFILES,
    Gpu,
    ModelProfile,
    StepTimeModel,
    get_gpu,
    get_profile,
)
from specpilot.tuner._model.step_cost import StepCost
from specpilot.tuner._model.surrogate import Surrogate
from specpilot.tuner.observation import Observation, joined
from specpilot.tuner.policy import (
    DEFAULT_MAX_BATCH,
    Decision,
    TrialVerdict,
    TunerSettings,
    decide,
    judge_trial,
    learn_trial,
)
from specpilot.tuner.priors import (
    TASKS,
    Task,
    acceptance_curve,
    prior_curves,
)
from specpilot.tuner.spec_config import (
    DRAFT_WEIGHT_METHODS,
    SPEC_METHODS,
    TREE_METHODS,
    ConfigError,
    ScheduleTier,
    SpecConfig,
    SpecMethod,
)
from specpilot.tuner.state import TunerState

__all__ = [
    "DEFAULT_MAX_BATCH",
    "DRAFT_WEIGHT_METHODS",
    "GPUS",
    "PROFILES",
    "SPEC_METHODS",
    "TASKS",
    "TREE_METHODS",
    "AcceptanceCurve",
    "ConfigError",
    "Decision",
    "Gpu",
    "ModelProfile",
    "Observation",
    "ScheduleTier",
    "SpecConfig",
    "SpecMethod",
    "StepCost",
    "StepTimeModel",
    "Surrogate",
    "Task",
    "TrialVerdict",
    "TunerSettings",
    "TunerState",
    "acceptance_curve",
    "decide",
    "get_gpu",
    "get_profile",
    "joined",
    "judge_trial",
    "learn_trial",
    "p_for_length",
    "prior_curves",
]
