"""The flat-tensor collectives under their current names.

torch 2.13 renamed ``all_gather_into_tensor`` and ``reduce_scatter_tensor`` to
``all_gather_single`` and ``reduce_scatter_single``; the old names are wrappers that call the new
ones (the same process-group call, so the same trace) after a FutureWarning on every call, which
filled the rank logs. Older torch (>= 2.4, pyproject) has only the old names, without the warning.
"""

from __future__ import annotations

import torch.distributed as dist

all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
