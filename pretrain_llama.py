"""Llama-3.1 pretraining with low-precision attention (entry point).

The training loop (megatron-core model, data, optimizer, checkpoint resume) is the subject of the
open issues "megatron-core integration", "Data" and "pretrain_llama.py"; until it lands, this entry
point runs the attention demo: every recipe of ``fp4_attention`` on one shape, against float64.
It says so on its first line, so that nobody mistakes it for a training run.
"""

import sys

from fp4_attention.demo import main

if __name__ == "__main__":
    print("pretrain_llama.py: the training loop is not implemented yet; running the attention demo "
          "(python -m fp4_attention.demo)", flush=True)
    raise SystemExit(main(sys.argv[1:]))
