"""Long matched trajectories on an N-GPU machine, run by ``bench/trajectory_session.py``, one module
per role:

- :mod:`trajectory.budget`: the device limits, the budget arithmetic (train_iters from the wall
  clock and the measured tokens/s/GPU), the runs per GPU, the deferred runs, the plan text;
- :mod:`trajectory.setup`: the first call's set-up on the machine (a private copy of the code, the
  megatron-core wheels, the data and its blend weights);
- :mod:`trajectory.lanes`: the detached per-GPU lanes that run the trainers across device calls,
  their status files, the progress lines and the packing of the results.
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
