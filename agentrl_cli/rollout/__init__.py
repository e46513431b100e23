"""Rollouts: the batched runner and the controllers (linear, vine, focus).

Each controller is registered here, once, with what it can do (`controllers.Controller`): its
in-process step, its step on the path scheduler (if any), whether it forks envs and whether its
step is a set of trees. Every driver and check reads these declarations, never a name.
"""
from .controllers import CONTROLLERS, LINEAR_READS, Controller, linear
from .focus import focus as focus_step
from .planner import PLANNER_READS
from .scheduler import focus_paths, linear_paths
from .vine import VINE_READS, vine as vine_step

CONTROLLERS.register("linear", Controller(linear, run_paths=linear_paths), reads=LINEAR_READS)
CONTROLLERS.register("vine", Controller(vine_step, forks=True), reads=VINE_READS)
CONTROLLERS.register("focus", Controller(focus_step, run_paths=focus_paths, forks=True, trees=True),
                     reads=PLANNER_READS)
