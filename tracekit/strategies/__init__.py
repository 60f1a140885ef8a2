"""The strategy vocabulary, torch-free: what a reference strategy is, which options a run takes,
and the op orders of the pipeline schedules.

    registry    each strategy declared once: its module, options, precisions, layout check,
                pipeline schedule, memory formula, demo runs
    options     RunOptions: each option declared once (the CLI's, the ranks' parser, the checks)
    schedules   the per-stage F/B op order of GPipe, 1F1B and PipeDream: the strategies run it,
                the analyses replay it

The strategies themselves (one readable module each, with torch) live outside tracekit and
import this package; tracekit never imports them (pyproject.toml's import contracts).
"""
