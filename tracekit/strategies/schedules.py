"""The pipeline schedules' op orders, written once: the strategies run them, the replay replays them.

p stages, m microbatches; F(j) / B(j) is the forward / backward of microbatch j on one stage.
A schedule is, per stage, the order in which that stage runs its ops (docs/strategies.md):

    gpipe      F0 F1 ... F(m-1), then B0 ... B(m-1): all forwards, then all backwards
               (torch's ScheduleGPipe; ``backward_order="reverse"`` gives B(m-1) ... B0, as
               most other implementations do), then a flush (GPipe, arXiv:1811.06965)
    1f1b       PipeDream-Flush (arXiv:2006.09503, Megatron arXiv:2104.04473 2.2.1): on stage r,
               w = min(p - r - 1, m) warm-up forwards, then "one forward, then the oldest
               backward" m - w times, then w cool-down backwards, then a flush
    pipedream  asynchronous PipeDream (arXiv:1806.03377): the 1F1B order with no flush, so the
               steps run back to back as ONE 1F1B stream of steps x m microbatches (warm-up
               once, cool-down once)

1F1B holds at most min(p - r, m) microbatches in flight on stage r, GPipe m; with uniform
stages both take (m + p - 1)(f + b) per step (tracekit.analyses.replay). For p = 4, m = 4:

    stage 0 (w = 3)   F0 F1 F2 F3 B0 B1 B2 B3
    stage 1 (w = 2)   F0 F1 F2 B0 F3 B1 B2 B3
    stage 3 (w = 0)   F0 B0 F1 B1 F2 B2 F3 B3

The reference runs (``pp_gpipe``, ``pp_1f1b``, ``pp_pipedream``) walk these lists op by op; tracekit.analyses.replay replays them with measured durations.
"""

from __future__ import annotations

FORWARD, BACKWARD = "F", "B"
SCHEDULES = ("gpipe", "1f1b", "pipedream")
BACKWARD_ORDERS = ("same", "reverse")

#: one op of a stage: ("F" or "B", microbatch)
Op = tuple[str, int]


def check(schedule: str, p: int, m: int, stage: int | None = None) -> None:
    """ValueError unless ``schedule`` is known, p >= 1, m >= 1 and 0 <= stage < p."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; expected one of {', '.join(SCHEDULES)}")
    if p < 1 or m < 1:
        raise ValueError(f"need p >= 1 stages and m >= 1 microbatches, got p={p}, m={m}")
    if stage is not None and not 0 <= stage < p:
        raise ValueError(f"stage {stage} outside 0..{p - 1}")


def gpipe(m: int, backward_order: str = "same") -> list[Op]:
    """GPipe's order of m microbatches: every forward, then every backward."""
    if backward_order not in BACKWARD_ORDERS:
        raise ValueError(f"backward_order must be 'same' or 'reverse', got {backward_order!r}")
    backwards = range(m) if backward_order == "same" else range(m - 1, -1, -1)
    return [(FORWARD, j) for j in range(m)] + [(BACKWARD, j) for j in backwards]


def one_f_one_b(p: int, stage: int, n: int) -> list[Op]:
    """The 1F1B order of n microbatches on ``stage`` of p: warm-up, steady 1F1B, cool-down."""
    warmup = min(p - stage - 1, n)  # enough forwards in flight to fill the stages below
    order = [(FORWARD, j) for j in range(warmup)]
    for i in range(n - warmup):  # steady state: one forward, then the oldest backward
        order += [(FORWARD, warmup + i), (BACKWARD, i)]
    order += [(BACKWARD, j) for j in range(n - warmup, n)]  # cool-down: drain what is in flight
    return order


def step_order(schedule: str, p: int, m: int, stage: int, backward_order: str = "same") -> list[Op]:
    """One step's op order on ``stage``: [("F", 0), ("F", 1), ..., ("B", 0), ...].

    ``backward_order`` applies to gpipe only. pipedream's one-step order is 1F1B's (its steps
    are one stream: :func:`stream`)."""
    check(schedule, p, m, stage)
    if schedule == "gpipe":
        return gpipe(m, backward_order)
    return one_f_one_b(p, stage, m)


def stream(
    schedule: str, p: int, m: int, stage: int, steps: int, backward_order: str = "same"
) -> list[tuple[str, int, int]]:
    """(kind, step, microbatch) of ``steps`` steps in the order ``stage`` runs them.

    gpipe and 1f1b flush every step, so the next step's ops follow this step's; pipedream never
    flushes, so microbatch g = step x m + j of every step is one 1F1B stream."""
    check(schedule, p, m, stage)
    if schedule == "pipedream":
        return [(kind, g // m, g % m) for kind, g in one_f_one_b(p, stage, steps * m)]
    one = step_order(schedule, p, m, stage, backward_order)
    return [(kind, s, j) for s in range(steps) for kind, j in one]
