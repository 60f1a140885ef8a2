"""A small CUDA training job profiled with tracekit.profile (the user-facing capture API).

Run: python scripts/gpu_profile_job.py OUT_DIR   (one process, one GPU; prints the run folder)
"""

from __future__ import annotations

import sys

import torch

import tracekit


def main(out: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(4)]).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(256, 2048, device="cuda")
    with tracekit.profile(out, wait=1, warmup=1, active=3) as prof:
        for _ in range(6):
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            prof.step()
    print(prof.run_dir if hasattr(prof, "run_dir") else out)


if __name__ == "__main__":
    main(sys.argv[1])
