"""Test hooks: what a test asks the ranks to save, hooked onto a strategy from outside.

The strategies' own classes hold the algorithm only; a test that must recompute something the
run did gets the inputs from here, switched on by an environment variable, saved after training.

TRACEKIT_PP_CHECK=1 (tests/test_pipeline_runs.py): PipeDream saves, per stage, one steady-state
backward to ``train/pp_check_rank<R>.pt``: its input, output gradient (or targets, on the last
stage), the stashed weights it differentiated through, the latest weights, and the gradients it
produced. The test recomputes the backward with both sets of weights: the gradients must be the
stashed ones', which proves weight stashing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from tracekit import runfolder

if TYPE_CHECKING:
    from instrumented_runs.harness import Context
    from instrumented_runs.pipeline import StageRunner


class Stashing(Protocol):
    """What the check reads of a PipeDream stage (instrumented_runs.pp_pipedream.PipeDream)."""

    runner: StageRunner
    version: int
    """Updates applied so far."""
    versions: dict[int, list[torch.nn.Parameter]]
    """Version -> its tensors, for every version still stashed."""

    def live(self) -> list[torch.nn.Parameter]: ...
    def microbatch(self, g: int) -> tuple[torch.Tensor, torch.Tensor]: ...


PP_CHECK_ENV = "TRACEKIT_PP_CHECK"


def pp_check_path(ctx: Context) -> Path:
    """train/pp_check_rank<R>.pt of this rank."""
    return runfolder.train_path(ctx.run, ctx.rank).with_name(f"pp_check_rank{ctx.rank}.pt")


def save_stashed_backward(ctx: Context, pd: Stashing) -> None:
    """With TRACEKIT_PP_CHECK=1: watch ``pd``'s backwards (its runner's ``backward``) and save the
    first steady-state one (staleness p - s - 1, after 2m updates) when training is done."""
    if os.environ.get(PP_CHECK_ENV) != "1":
        return
    runner = pd.runner
    saved: dict[str, Any] = {}
    backward = runner.backward

    def watched(mb: int, version: int | None = None, staleness: int | None = None) -> Any:
        want = (
            not saved
            and pd.version >= 2 * runner.m
            and staleness == runner.p - runner.s - 1
            and version is not None
        )
        x = runner.input_of(mb).detach().clone() if want else None
        grad_out = backward(mb, version=version, staleness=staleness)
        if x is not None and version is not None:
            clone = lambda ts: [t.detach().clone() for t in ts]  # noqa: E731
            saved.update(
                mb=mb,
                version=version,
                latest_version=pd.version,
                input=x,
                grad_output=grad_out,
                targets=pd.microbatch(mb)[1] if runner.stage.last else None,
                names=[runner.stage.global_name(n) for n, _ in runner.stage.named_parameters()],
                stashed=clone(pd.versions[version]),
                latest=clone(pd.live()),
                grads=clone(t.grad for t in pd.versions[version]),
            )
        return grad_out

    def save() -> None:
        if saved:
            path = pp_check_path(ctx)
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save(saved, path)

    runner.backward = watched  # type: ignore[method-assign]
    ctx.at_finish(save)
