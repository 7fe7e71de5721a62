"""The training-throughput benchmark run by ``bench/train_throughput.py``, one module per role:

- :mod:`throughput.plan`: the runs (arm, micro-batch, layer count), their overrides, order and validation;
- :mod:`throughput.process`: supervising one child process (process group, time limit, SIGTERM,
  device memory, log tail, failure reason);
- :mod:`throughput.attention`: the attention alone at the training shape (in a child process);
- :mod:`throughput.analysis`: a run's numbers from its ``metrics.jsonl``, the ratios and shares
  derived from them, the targets, the extrapolation to 32 layers;
- :mod:`throughput.report`: the metadata, the JSON document and the markdown report;
- :mod:`throughput.runner`: the attention timing and the runs in order, within the budget, writing
  the outputs after every run.
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
