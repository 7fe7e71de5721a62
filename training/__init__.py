"""The training job behind ``pretrain_llama.py``; small modules with one job each.

| module | job |
|---|---|
| ``config`` | YAML sections -> validated dataclasses, overrides |
| ``resolved`` | the resolved config (saved with the run and every checkpoint) |
| ``plan`` | layout, batch arithmetic, steps, memory, FLOPs, time estimate (``--dry-run``, start-up checks) |
| ``schedule`` | the LR schedule (warmup, cosine, floor), used by both engines |
| ``ranks`` | torchrun / Slurm rank variables (no torch) |
| ``distenv`` | process group, megatron-core parallel state |
| ``data_setup`` | tokenizer, corpus, GPTDatasets, consumed-samples loaders |
| ``engine``, ``engine_megatron``, ``engine_cpu`` | model + optimizer + engine checkpoint files (GPU / CPU) |
| ``checkpoint`` | iter_XXXXXXX/ layout and names, manifest, latest marker, retention, resume compatibility |
| ``state`` | ``TrainerState``: the trainer's counters a checkpoint saves (``trainer_state.json``) |
| ``metrics`` | metrics.jsonl, run_meta.json, terminal, TensorBoard, wandb |
| ``records`` | which metrics.jsonl records a relaunch supersedes (no torch: the tools read it) |
| ``progress`` | elapsed time and ETA of the per-step line, throughput units, the run summary |
| ``fingerprint`` | the config fingerprint's key list (no torch: ``tools/compare_runs.py`` reads it) |
| ``telemetry`` | attention max logit and NVFP4 zero-scale-block fraction (sampled hook) |
| ``run_lock`` | ``run.lock``: one live run per run / checkpoint directory |
| ``signals`` | SIGTERM/SIGUSR1 and time budget flags; the exit codes |
| ``trainer`` | the loop |
"""
