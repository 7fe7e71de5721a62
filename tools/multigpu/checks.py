"""The checks of the multi-GPU report: DP and TP parity with one process, preemption and resume at the
same world size, resume at DP=1 from a DP=N checkpoint. Each check is a dict: ``id``, ``title``,
``status`` (PASS / FAIL / SKIP), ``measured``, ``bound``, ``why`` and the numbers in ``detail``."""

from __future__ import annotations

import math

from .bench_dir import (
    BenchRuns,
    accumulation_per_rank,
    cpu_initialized,
    launch_segments,
    log_message,
    seed_of,
    train_losses,
)
from .tolerances import Tolerances


def compare_losses(a: dict[int, float], b: dict[int, float], steps: list[int]) -> dict:
    """Per-step comparison of loss dicts ``a`` (a run) and ``b`` (its reference) over ``steps``.

    Returns ``max_abs`` (inf when a loss is not finite), ``max_rel`` (|a - b| / |b|), ``at_step`` (the
    step of ``max_abs``), ``bitwise`` (every compared step equal as floats), ``compared`` (number of
    steps present in both) and ``missing`` (steps absent from ``a`` or ``b``).
    """
    missing = [s for s in steps if s not in a or s not in b]
    max_abs, max_rel, at_step, bitwise, compared = 0.0, 0.0, None, True, 0
    for s in steps:
        if s not in a or s not in b:
            continue
        compared += 1
        x, y = a[s], b[s]
        if not (math.isfinite(x) and math.isfinite(y)):
            d = math.inf
        else:
            d = abs(x - y)
        if x != y:
            bitwise = False
        rel = d / abs(y) if y and math.isfinite(y) else (0.0 if d == 0 else math.inf)
        if at_step is None or d > max_abs:
            max_abs, at_step = d, s
        max_rel = max(max_rel, rel)
    return {
        "max_abs": max_abs,
        "max_rel": max_rel,
        "at_step": at_step,
        "bitwise": bitwise and not missing,
        "compared": compared,
        "missing": missing,
    }


def fmt(x) -> str:
    """A number for the report: ``-`` for None, ``0``, ``inf``/``nan`` or 3 significant digits."""
    if x is None:
        return "-"
    if isinstance(x, float):
        if x == 0:
            return "0"
        if not math.isfinite(x):
            return str(x)
        return f"{x:.3e}"
    return str(x)


def steps_str(steps: list[int], limit: int = 12) -> str:
    """The first ``limit`` steps of a list, and how many there are in all."""
    head = ", ".join(map(str, steps[:limit]))
    return head + (f", ... ({len(steps)} in all)" if len(steps) > limit else "")


def _check(cid: str, title: str, status: str, measured: str, bound: str, why: str, **detail) -> dict:
    return {
        "id": cid,
        "title": title,
        "status": status,
        "measured": measured,
        "bound": bound,
        "why": why,
        "detail": detail,
    }


def parity_check(
    runs: BenchRuns, cid: str, title: str, name: str, ref: str, steps: list[int], tol: float, why: str
) -> dict:
    """Per-step training loss of run ``name`` vs run ``ref``: every step present, max |diff| <= ``tol``."""
    for label in (name, ref):
        why_not = runs.failure(label)
        if why_not is not None:
            return _check(
                cid,
                title,
                "SKIP" if runs.skipped(label) else "FAIL",
                why_not,
                f"max |diff| <= {fmt(tol)}",
                why,
            )
    cmp = compare_losses(runs.losses[name], runs.losses[ref], steps)
    ok = not cmp["missing"] and cmp["max_abs"] <= tol
    measured = (
        f"max |diff| {fmt(cmp['max_abs'])} (step {cmp['at_step']}), max rel {fmt(cmp['max_rel'])}, "
        f"{'bitwise equal' if cmp['bitwise'] else 'not bitwise'} over {cmp['compared']} steps"
    )
    if cmp["missing"]:
        measured += f"; steps missing: {steps_str(cmp['missing'])}"
    return _check(cid, title, "PASS" if ok else "FAIL", measured, f"max |diff| <= {fmt(tol)}", why, **cmp)


def step1_check(runs: BenchRuns, nproc: int, tol: float, why: str) -> dict:
    """Step 1 of dp vs ref: |loss diff| <= tol and grad-norm relative diff <= tol."""
    title = f"DP={nproc} vs DP=1 at step 1: loss and gradient norm"
    bound = f"|loss diff| <= {fmt(tol)} and |grad-norm diff| / grad norm <= {fmt(tol)}"
    for label in ("dp", "ref"):
        why_not = runs.failure(label)
        if why_not is not None:
            return _check("dp_step1", title, "SKIP" if runs.skipped(label) else "FAIL", why_not, bound, why)
    first = {}
    for name in ("dp", "ref"):
        recs = [r for r in runs.records[name] if r.get("kind") == "train" and r.get("step") == 1]
        first[name] = recs[-1] if recs else None
    if first["dp"] is None or first["ref"] is None:
        return _check("dp_step1", title, "FAIL", "step 1 missing from dp or ref", bound, why)
    loss_d = abs(float(first["dp"]["loss"]) - float(first["ref"]["loss"]))
    g_dp, g_ref = first["dp"].get("grad_norm"), first["ref"].get("grad_norm")
    grad_rel = abs(g_dp - g_ref) / abs(g_ref) if g_dp is not None and g_ref else math.inf
    if not math.isfinite(loss_d):
        loss_d = math.inf
    ok = loss_d <= tol and grad_rel <= tol
    measured = (
        f"|loss diff| {fmt(loss_d)} ({first['ref']['loss']} vs {first['dp']['loss']}), grad norm "
        f"{g_ref} (ref) vs {g_dp} (dp): relative diff {fmt(grad_rel)}"
    )
    return _check(
        "dp_step1",
        title,
        "PASS" if ok else "FAIL",
        measured,
        bound,
        why,
        loss_abs=loss_d,
        grad_norm_rel=grad_rel,
    )


def yardstick(runs: BenchRuns, steps: list[int]) -> dict | None:
    """The seed run (another init) compared with ref, or None when it is not usable."""
    if (
        runs.failure("seed") is None
        and runs.failure("ref") is None
        and seed_of(runs.out / "seed") != seed_of(runs.out / "ref")
    ):
        cmp = compare_losses(runs.losses["seed"], runs.losses["ref"], steps)
        if not cmp["missing"] and math.isfinite(cmp["max_abs"]):
            return cmp
    return None


def tp_check(
    runs: BenchRuns, steps: list[int], total: int, yard: dict | None, dp_tol: float = Tolerances.DP
) -> dict:
    """TP=2 vs ref: with CPU initialisation in both runs (same initial weights for any TP size) the DP
    bound ``dp_tol``, else bounded by the seed run's distance from ref (another init), see
    Tolerances.TP_WHY."""
    title = f"TP=2 vs DP=1: per-step training loss, steps 1..{total}"
    if cpu_initialized(runs.out / "tp") and cpu_initialized(runs.out / "ref"):
        return parity_check(
            runs,
            "tp_vs_ref",
            title,
            "tp",
            "ref",
            steps,
            dp_tol,
            Tolerances.TP_CPU_INIT_WHY + f" Bound: the DP bound, {fmt(dp_tol)}.",
        )
    if yard is None:
        tol, why = Tolerances.TP_FALLBACK, Tolerances.TP_FALLBACK_WHY
    else:
        tol, why = Tolerances.TP_YARDSTICK_FACTOR * yard["max_abs"] + Tolerances.DP, Tolerances.TP_WHY
    check = parity_check(runs, "tp_vs_ref", title, "tp", "ref", steps, tol, why)
    if yard is not None:
        check["measured"] += (
            f"; yardstick: seed run vs ref max |diff| {fmt(yard['max_abs'])} (step {yard['at_step']})"
        )
        check["bound"] = (
            f"max |diff| <= {Tolerances.TP_YARDSTICK_FACTOR:g} x {fmt(yard['max_abs'])} + "
            f"{fmt(Tolerances.DP)} = {fmt(tol)}"
        )
        check["detail"]["yardstick"] = yard
    return check


def preempt_checks(runs: BenchRuns, steps: list[int], total: int, preempt_at: int) -> dict:
    """The preempt run (a SIGTERMed launch, then the relaunch): exit codes, every step logged once, and
    the steps before and after the stop bitwise equal to the uninterrupted dp run. Returns ``info``
    (exit codes, stop and resume steps, missing and repeated steps) and ``checks``."""
    r1, r2 = runs.row("preempt.1"), runs.row("preempt.2")
    info: dict = {"exit_codes": [r1 and r1["rc"], r2 and r2["rc"]], "sigterm": r1 and r1["status"]}
    if runs.skipped("preempt.1") or runs.skipped("preempt.2"):
        why = (
            "preempt was not run"
            if r1 is None
            else f"preempt.1 {r1['status']}"
            if runs.skipped("preempt.1")
            else "preempt.2 was not run"
            if r2 is None
            else f"preempt.2 {r2['status']}"
        )
        return {
            "info": info,
            "checks": [
                _check(c, t, "SKIP", why, b, w)
                for c, t, b, w in (
                    ("preempt_exit_codes", "preempt: exit codes", "3 then 0", "training/signals.py"),
                    ("preempt_steps_once", "preempt: every step logged once", "each step once", ""),
                    (
                        "preempt_resume_exact",
                        "preempt: resumed steps vs dp",
                        "bitwise",
                        Tolerances.RESUME_WHY,
                    ),
                    (
                        "preempt_before_exact",
                        "preempt: steps before the stop vs dp",
                        "bitwise",
                        Tolerances.BEFORE_WHY,
                    ),
                )
            ],
        }
    codes = info["exit_codes"]
    checks = [
        _check(
            "preempt_exit_codes",
            "preempt: exit code of the SIGTERMed launch, then of the relaunch",
            "PASS" if codes == [3, 0] else "FAIL",
            f"{codes[0]} then {codes[1]}",
            "3 then 0",
            "3 = preempted after saving a checkpoint, 0 = done (training/signals.py); the codes "
            "reach torchrun_node.sh through PRETRAIN_EXIT_FILE",
            messages=[runs.failure(lbl) for lbl in ("preempt.1", "preempt.2")],
        )
    ]
    segments = launch_segments(runs.records["preempt"])
    checks.append(_steps_once_check(runs.records["preempt"], segments, steps, total, preempt_at, info))
    checks += _preempt_exact_checks(runs, segments, steps, info["stopped_after"])
    return {"info": info, "checks": checks}


def _steps_once_check(
    recs: list[dict], segments: list[list[dict]], steps: list[int], total: int, preempt_at: int, info: dict
) -> dict:
    """Every step logged exactly once across the two launches, the relaunch resuming at the stop step;
    adds the stop and resume steps, missing and repeated steps to ``info``."""
    per_step: dict[int, int] = {}
    for r in recs:
        if r.get("kind") == "train":
            per_step[r["step"]] = per_step.get(r["step"], 0) + 1
    missing = [s for s in steps if s not in per_step]
    dupes = sorted(s for s, n in per_step.items() if n > 1)
    extra = sorted(s for s in per_step if s not in steps)
    first_steps = [r["step"] for r in segments[0] if r.get("kind") == "train"] if segments else []
    stopped = max(first_steps) if first_steps else None
    resume_events = [r for r in recs if r.get("kind") == "event" and r.get("event") == "resume"]
    resumed_from = resume_events[-1]["step"] if resume_events else None
    info.update(
        stopped_after=stopped,
        resumed_from=resumed_from,
        launches=len(segments),
        resume_detail=resume_events[-1].get("detail") if resume_events else None,
        missing=missing,
        duplicates=dupes,
    )
    problems = []
    if missing:
        problems.append(f"steps missing: {steps_str(missing)}")
    if dupes:
        problems.append(f"steps logged more than once: {steps_str(dupes)}")
    if extra:
        problems.append(f"steps beyond {total}: {steps_str(extra)}")
    if len(segments) != 2:
        problems.append(f"{len(segments)} launch(es) in metrics.jsonl, expected 2")
    if resumed_from is None or resumed_from != stopped:
        problems.append(f"resume event at step {resumed_from}, the first launch stopped after {stopped}")
    if stopped is not None and not (preempt_at <= stopped < total):
        problems.append(
            f"first launch stopped after step {stopped}: not in [{preempt_at}, {total}) "
            "(SIGTERM too late? raise training.train_iters)"
        )
    measured = f"stopped after step {stopped}, resumed from step {resumed_from}; " + (
        "; ".join(problems) if problems else f"every step 1..{total} logged exactly once"
    )
    return _check(
        "preempt_steps_once",
        "preempt: steps logged exactly once across the two launches, resume from the stop step",
        "FAIL" if problems else "PASS",
        measured,
        f"each step 1..{total} once; resume step = stop step >= {preempt_at}",
        "the stop saves a checkpoint at the step it finished; the relaunch resumes exactly there "
        "(training/trainer.py), so no step is lost or repeated",
    )


def _preempt_exact_checks(
    runs: BenchRuns, segments: list[list[dict]], steps: list[int], stopped: int | None
) -> list[dict]:
    """The steps after the stop (the relaunch) and before it (the first launch) vs the dp run: bitwise."""
    fail_dp = runs.failure("dp")
    pre = train_losses(segments[0]) if segments else {}
    post = train_losses([r for seg in segments[1:] for r in seg])
    checks = []
    for cid, title, part, sub, why in (
        (
            "preempt_resume_exact",
            "preempt: resumed steps vs the uninterrupted dp run",
            post,
            [s for s in steps if stopped is not None and s > stopped],
            Tolerances.RESUME_WHY,
        ),
        (
            "preempt_before_exact",
            "preempt: steps before the stop vs the dp run",
            pre,
            [s for s in steps if stopped is not None and s <= stopped],
            Tolerances.BEFORE_WHY,
        ),
    ):
        if fail_dp is not None:
            checks.append(
                _check(
                    cid,
                    title,
                    "SKIP" if runs.skipped("dp") else "FAIL",
                    fail_dp,
                    "bitwise (tolerance 0)",
                    why,
                )
            )
            continue
        if not sub:
            checks.append(
                _check(
                    cid,
                    title,
                    "FAIL",
                    "no steps to compare (see preempt_steps_once)",
                    "bitwise (tolerance 0)",
                    why,
                )
            )
            continue
        cmp = compare_losses(part, runs.losses["dp"], sub)
        ok = cmp["bitwise"] and cmp["max_abs"] <= Tolerances.EXACT
        measured = (
            f"steps {sub[0]}..{sub[-1]}: max |diff| {fmt(cmp['max_abs'])} (step {cmp['at_step']}), "
            f"{'bitwise equal' if cmp['bitwise'] else 'NOT bitwise equal'}"
        )
        if cmp["missing"]:
            measured += f"; steps missing: {steps_str(cmp['missing'])}"
        checks.append(
            _check(cid, title, "PASS" if ok else "FAIL", measured, "bitwise (tolerance 0)", why, **cmp)
        )
    return checks


def reshard_check(
    runs: BenchRuns, steps: list[int], total: int, reshard_step: int, tol: float, why: str
) -> dict:
    """dp's checkpoint resumed at DP=1: works (resumes at ``reshard_step``, then within ``tol`` of ref and
    dp) or refuses with a clear message (exit 2). Returns ``info`` (the outcome, log notes) and
    ``check``."""
    title = f"reshard: dp's step-{reshard_step} checkpoint resumed with 1 process (DP=1)"
    bound = (
        f"works and steps {reshard_step + 1}..{total} within max |diff| <= {fmt(tol)} of ref and dp, "
        "or stops with a clear message (exit 2)"
    )
    why = (
        "megatron-core saves the distributed optimizer as dp_reshardable (training/engine_megatron.py), "
        "so a different DP size may load it; after the load the run is a DP=1 run, hence the DP bound. " + why
    )
    row = runs.row("reshard")
    info: dict = {"outcome": None}
    if runs.skipped("reshard"):
        msg = "reshard was not run" if row is None else f"reshard {row['status']}"
        info["outcome"] = "skipped"
        return {"info": info, "check": _check("reshard", title, "SKIP", msg, bound, why)}
    log = runs.out / "reshard.log"
    notes = []
    if log.is_file():
        notes = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if "resume:" in ln][:4]
    info["log_notes"] = notes
    if runs.failure("reshard") is None:
        status, measured, result = _reshard_works(runs, steps, reshard_step, tol)
        info.update(outcome="works", comparisons=result)
        return {"info": info, "check": _check("reshard", title, status, measured, bound, why, **result)}
    message = log_message(log)
    if row["rc"] == 2:
        info.update(outcome="refused", message=message)
        return {
            "info": info,
            "check": _check("reshard", title, "PASS", f"refused (exit 2): {message}", bound, why),
        }
    info.update(outcome="failed", message=message)
    measured = f"failed (exit {row['rc']}, {row['status']}): {message}"
    return {"info": info, "check": _check("reshard", title, "FAIL", measured, bound, why)}


def _reshard_works(runs: BenchRuns, steps: list[int], reshard_step: int, tol: float) -> tuple[str, str, dict]:
    """The reshard run that exited 0: (PASS or FAIL, measured, its comparisons with ref and dp)."""
    recs = runs.records["reshard"]
    resumes = [r for r in recs if r.get("kind") == "event" and r.get("event") == "resume"]
    losses = train_losses(recs)
    sub = [s for s in steps if s > reshard_step]
    problems = []
    if not resumes or resumes[0]["step"] != reshard_step:
        problems.append(
            f"no resume from step {reshard_step} in metrics.jsonl "
            f"(resume events at {[r['step'] for r in resumes]})"
        )
    if any(s <= reshard_step for s in losses):
        problems.append(f"trained steps <= {reshard_step}: it did not start from the checkpoint")
    result, notes = {}, []
    for ref in ("ref", "dp"):
        fail = runs.failure(ref)
        if fail is not None:
            (notes if runs.skipped(ref) else problems).append(f"cannot compare with {ref}: {fail}")
            continue
        cmp = compare_losses(losses, runs.losses[ref], sub)
        result[ref] = cmp
        if cmp["missing"] or cmp["max_abs"] > tol:
            problems.append(
                f"vs {ref}: max |diff| {fmt(cmp['max_abs'])} (step {cmp['at_step']})"
                + (f", steps missing {steps_str(cmp['missing'])}" if cmp["missing"] else "")
            )
    measured = "works: " + ", ".join(
        f"vs {ref} max |diff| {fmt(c['max_abs'])} (step {c['at_step']}, "
        f"{'bitwise' if c['bitwise'] else 'not bitwise'})"
        for ref, c in result.items()
    )
    if not result:
        problems.append("nothing to compare with")
    if problems or notes:
        measured += "; " + "; ".join(problems + notes)
    return "FAIL" if problems else "PASS", measured, result


def dp_bound(runs: BenchRuns, steps: list[int], *, cpu_exact: bool) -> tuple[float, str, dict | None]:
    """The DP parity bound and its reason, and the seed yardstick (None when not usable): exact when
    ``cpu_exact``, else the a-priori bound, raised to half the seed run's distance from ref when that
    is larger."""
    tol, why = (Tolerances.EXACT, Tolerances.CPU_DP_WHY) if cpu_exact else (Tolerances.DP, Tolerances.DP_WHY)
    yard = yardstick(runs, steps)
    if not cpu_exact and yard is not None:
        tol = max(Tolerances.DP, Tolerances.YARD_FRACTION * yard["max_abs"])
        why = Tolerances.DP_YARD_WHY.format(yard=fmt(yard["max_abs"]), tol=fmt(tol))
    return tol, why, yard


def run_checks(
    runs: BenchRuns, *, total: int, nproc: int, is_cpu: bool, preempt_at: int, reshard_step: int
) -> dict:
    """Every check over steps 1..``total``, in the report's order: ``checks`` (the list), ``preempt`` and
    ``reshard`` (what the report says about those two runs besides their checks)."""
    steps = list(range(1, total + 1))
    # exact on the CPU engine when every DP rank runs one micro-batch per step
    exact = is_cpu and accumulation_per_rank(runs.out / "dp") == 1
    dp_tol, dp_why, yard = dp_bound(runs, steps, cpu_exact=exact)
    checks = [
        parity_check(
            runs,
            "dp_vs_ref",
            f"DP={nproc} vs DP=1: per-step training loss, steps 1..{total}",
            "dp",
            "ref",
            steps,
            dp_tol,
            dp_why,
        ),
        step1_check(
            runs,
            nproc,
            Tolerances.EXACT if exact else Tolerances.DP_STEP1,
            dp_why if exact else Tolerances.DP_STEP1_WHY,
        ),
        tp_check(runs, steps, total, yard, dp_tol),
    ]
    if yard is not None and checks[0]["status"] in ("PASS", "FAIL"):
        checks[0]["measured"] += (
            f" (for scale: another init, the seed run, is {fmt(yard['max_abs'])} from ref)"
        )
    preempt = preempt_checks(runs, steps, total, preempt_at)
    reshard = reshard_check(runs, steps, total, reshard_step, dp_tol, dp_why)
    return {
        "checks": [*checks, *preempt["checks"], reshard["check"]],
        "preempt": preempt["info"],
        "reshard": reshard["info"],
    }
