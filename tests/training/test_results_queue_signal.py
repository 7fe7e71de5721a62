"""The checkpoint writer's results queue survives the preemption SIGTERM (found on 4 H200s).

torchrun stops workers with os.killpg, which also reaches the multiprocessing manager process behind
megatron-core's write-results queue; training.engine_megatron installs a queue whose manager ignores
SIGTERM, so the save that the SIGTERM triggers can finish."""

import os
import signal
import time

import pytest

fa = pytest.importorskip("megatron.core.dist_checkpointing.strategies.filesystem_async")


def test_results_queue_manager_ignores_sigterm():
    from training import engine_megatron as em

    saved = fa._results_queue
    fa._results_queue = None
    try:
        em._signal_proof_write_results_queue()
        q = fa._results_queue
        assert q is not None and fa.get_write_results_queue() is q  # megatron's getter returns ours
        pid = em._RESULTS_MANAGER._process.pid
        os.kill(pid, signal.SIGTERM)
        time.sleep(0.5)
        assert em._RESULTS_MANAGER._process.is_alive()
        q.put({"rank": 0, "ok": True})
        assert q.get(timeout=5) == {"rank": 0, "ok": True}
        em._signal_proof_write_results_queue()  # idempotent: the installed queue stays
        assert fa._results_queue is q
    finally:
        if em._RESULTS_MANAGER is not None:
            em._RESULTS_MANAGER.shutdown()
            em._RESULTS_MANAGER = None
        fa._results_queue = saved


def test_a_plain_manager_dies_on_sigterm():
    """The failure the fix prevents: megatron's own manager process dies on SIGTERM."""
    import multiprocessing as mp

    manager = mp.get_context("spawn").Manager()
    q = manager.Queue()
    os.kill(manager._process.pid, signal.SIGTERM)
    manager._process.join(5)
    assert not manager._process.is_alive()
    with pytest.raises((BrokenPipeError, EOFError, ConnectionError, OSError)):
        q.put(1)
