"""Collective facts of single events: which op, how many bytes, what dtype, which group, which peer.

Kept apart from the Kineto reader because these rules are the part that changes with torch
versions: the names of the ``c10d::`` dispatcher ops and which of their arguments holds the
tensor that defines the nominal size S, the ``Collective name`` strings of
``record_param_comms``, the dtype spellings of ``Input type`` (C++ names) and ``dtype``
(ScalarType names).

Everything here is vectorised over the events frame (``pl.when`` / ``str`` / ``replace_strict``)
except :func:`call_bytes`, which reads the nested ``Input Dims`` JSON of the few rows that are
collective calls (about one event in a hundred).
"""

from __future__ import annotations

import math
from typing import Any

import msgspec
import polars as pl

# --- op names ------------------------------------------------------------------------------

#: One regex over a name with underscores removed and lower-cased: ``_allgather_base_``,
#: ``all_gather_into_tensor_coalesced``, ``AllGather`` all become a word starting ``allgather``.
#: ``sendrecv`` is listed so that NCCL's ``SendRecv`` kernels are not taken for ``send``.
_OP_WORD = (
    r"^(allreduce|allgather|reducescatter|alltoall|broadcast|reduce|sendrecv|send|recv"
    r"|monitoredbarrier|barrier)"
)
_OP_NAMES = {
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "reducescatter": "reduce_scatter",
    "alltoall": "all_to_all",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "send": "send",
    "recv": "recv",
    "barrier": "barrier",
    "monitoredbarrier": "barrier",
}  # "sendrecv" (a SendRecv kernel: send, recv or all_to_all alike) deliberately maps to null

#: For each ``c10d::`` dispatcher op (torch/csrc/distributed/c10d/Ops.cpp): the argument whose
#: ``Input Dims`` give S, and whether S is that size times the group size (the argument is a
#: per-rank input of an all-gather, or a per-rank output of a reduce-scatter, and the
#: other side is a ``Tensor[][]`` that the profiler does not record).
C10D_ARG: dict[str, tuple[int, bool]] = {
    "allreduce_": (0, False),
    "allreduce_coalesced_": (0, False),
    "allgather_": (1, True),  # (Tensor[][] out, Tensor[] in, ...)
    "allgather_coalesced_": (1, True),
    "_allgather_base_": (0, False),  # (Tensor out, Tensor in, ...)
    "allgather_into_tensor_coalesced_": (0, False),  # (Tensor[] outs, Tensor[] ins, ...)
    "reduce_scatter_": (0, True),  # (Tensor[] out, Tensor[][] in, ...)
    "_reduce_scatter_base_": (1, False),  # (Tensor out, Tensor in, ...)
    "reduce_scatter_tensor_coalesced_": (1, False),
    "broadcast_": (0, False),
    "reduce_": (0, False),
    "alltoall_": (1, False),  # (Tensor[] out, Tensor[] in, ...)
    "alltoall_base_": (1, False),  # (Tensor out, Tensor in, ...)
    "send": (0, False),  # (Tensor[] t, pg, int dstRank, int tag)
    "recv_": (0, False),  # (Tensor[] t, pg, int srcRank, int tag)
    "recv_any_source_": (0, False),
}
#: Index in ``Concrete Inputs`` of the peer rank of ``c10d::send`` / ``c10d::recv_``.
P2P_PEER_ARG = 2

# --- dtypes --------------------------------------------------------------------------------

#: Lower-cased spelling -> (canonical torch name, bytes per element). Spellings come from two
#: places: ``Input type`` (C++ type names: ``float``, ``c10::BFloat16``, ``long int``) and the
#: ``dtype`` arg of ``record_param_comms`` (ScalarType names: ``Float``, ``BFloat16``, ``Long``,
#: ``Char`` = int8, ``Byte`` = uint8).
DTYPES: dict[str, tuple[str, int]] = {
    **dict.fromkeys(["float", "float32", "torch.float32"], ("float32", 4)),
    **dict.fromkeys(["double", "float64", "torch.float64"], ("float64", 8)),
    **dict.fromkeys(["c10::half", "half", "float16", "torch.float16"], ("float16", 2)),
    **dict.fromkeys(["c10::bfloat16", "bfloat16", "torch.bfloat16"], ("bfloat16", 2)),
    **dict.fromkeys(
        ["long int", "long", "long long int", "long long", "int64", "int64_t", "torch.int64"],
        ("int64", 8),
    ),
    **dict.fromkeys(["int", "int32", "int32_t", "torch.int32"], ("int32", 4)),
    **dict.fromkeys(["short int", "short", "int16", "int16_t", "torch.int16"], ("int16", 2)),
    **dict.fromkeys(["signed char", "char", "int8", "int8_t", "torch.int8"], ("int8", 1)),
    **dict.fromkeys(["unsigned char", "byte", "uint8", "uint8_t", "torch.uint8"], ("uint8", 1)),
    **dict.fromkeys(["unsigned short", "unsigned short int", "uint16", "uint16_t"], ("uint16", 2)),
    **dict.fromkeys(["unsigned int", "uint32", "uint32_t"], ("uint32", 4)),
    **dict.fromkeys(["unsigned long", "unsigned long int", "uint64", "uint64_t"], ("uint64", 8)),
    **dict.fromkeys(["bool", "torch.bool"], ("bool", 1)),
    **dict.fromkeys(["c10::complex<float>", "complexfloat", "complex64"], ("complex64", 8)),
    **dict.fromkeys(["c10::complex<double>", "complexdouble", "complex128"], ("complex128", 16)),
    **dict.fromkeys(["c10::complex<c10::half>", "complexhalf", "complex32"], ("complex32", 4)),
    **dict.fromkeys(["c10::float8_e4m3fn", "float8_e4m3fn"], ("float8_e4m3fn", 1)),
    **dict.fromkeys(["c10::float8_e5m2", "float8_e5m2"], ("float8_e5m2", 1)),
    **dict.fromkeys(["c10::float8_e4m3fnuz", "float8_e4m3fnuz"], ("float8_e4m3fnuz", 1)),
    **dict.fromkeys(["c10::float8_e5m2fnuz", "float8_e5m2fnuz"], ("float8_e5m2fnuz", 1)),
}
_DTYPE_NAME = {k: v[0] for k, v in DTYPES.items()}
_DTYPE_SIZE = {k: v[1] for k, v in DTYPES.items()}

# --- which rows are collective calls --------------------------------------------------------

#: Backends whose ProcessGroup wraps each collective in a ``<backend>:<op>`` record function
#: carrying the input tensors' shapes and dtypes.
BACKEND_PREFIX = r"^(gloo|nccl|ucc|mpi|xccl|hccl):"
_KERNEL_OP = r"(?i)(?:nccl|rccl)(?:Dev)?Kernel_([A-Za-z]+)"


def op_from_word(word: pl.Expr) -> pl.Expr:
    """The op name (docs/labels.md "Op names") from any spelling of a collective (c10d op, Collective name, kernel word)."""
    compact = word.str.to_lowercase().str.replace_all("_", "", literal=True)
    return compact.str.extract(_OP_WORD, 1).replace_strict(
        _OP_NAMES, default=None, return_dtype=pl.Utf8
    )


def family_expr() -> pl.Expr:
    """Where a row's collective facts come from: params | c10d | backend | kernel | null.

    - ``params``: the event carries ``record_param_comms`` args (``Collective name``); GPU traces
      put them on ``record_param_comms`` cpu_ops and, in recent torch, on the NCCL kernels too.
    - ``c10d``: a ``c10d::<op>`` dispatcher cpu_op on the calling thread (CPU and GPU traces).
    - ``backend``: a ``gloo:<op>`` / ``nccl:<op>`` record function (user_annotation) with its own
      ``Input Dims`` / ``Input type``.
    - ``kernel``: a communication kernel without args; the op is read off its name.
    """
    cat, name = pl.col("cat"), pl.col("name")
    return (
        pl.when(pl.col("coll_name").is_not_null())
        .then(pl.lit("params"))
        .when((cat == "cpu_op") & name.str.starts_with("c10d::"))
        .then(pl.lit("c10d"))
        .when(cat.is_in(["cpu_op", "user_annotation"]) & name.str.contains(BACKEND_PREFIX))
        .then(pl.lit("backend"))
        .when((cat == "kernel") & (pl.col("kind") == "communication"))
        .then(pl.lit("kernel"))
        .otherwise(pl.lit(None, dtype=pl.Utf8))
    )


def op_expr() -> pl.Expr:
    """The op word per family, mapped to the op names of docs/labels.md (null when not one of them)."""
    fam, name = pl.col("family"), pl.col("name")
    word = (
        pl.when(fam == "params")
        .then(pl.col("coll_name"))
        .when(fam == "c10d")
        .then(name.str.strip_prefix("c10d::"))
        .when(fam == "backend")
        .then(name.str.replace(BACKEND_PREFIX, ""))
        .when(fam == "kernel")
        .then(name.str.extract(_KERNEL_OP, 1))
        .otherwise(pl.lit(None, dtype=pl.Utf8))
    )
    return op_from_word(word)


def arg_rule_exprs() -> list[pl.Expr]:
    """``arg_index`` (which Input Dims argument gives S; -1 = all tensors) and ``scale_n``."""
    fam, op = pl.col("family"), pl.col("op")
    c10d_name = pl.col("name").str.strip_prefix("c10d::")
    index_map = {k: v[0] for k, v in C10D_ARG.items()}
    scale_map = {k: v[1] for k, v in C10D_ARG.items()}
    return [
        pl.when(fam == "c10d")
        .then(c10d_name.replace_strict(index_map, default=None, return_dtype=pl.Int32))
        .when(fam == "backend")
        .then(pl.lit(-1, dtype=pl.Int32))
        .otherwise(pl.lit(None, dtype=pl.Int32))
        .alias("arg_index"),
        pl.when(fam == "c10d")
        .then(c10d_name.replace_strict(scale_map, default=False, return_dtype=pl.Boolean))
        .when(fam == "backend")
        .then(op == "all_gather")
        .otherwise(pl.lit(False))
        .alias("scale_n"),
    ]


def safe_product(a: pl.Expr, b: pl.Expr) -> pl.Expr:
    """a x b as Int64, null when either is negative or the product would overflow int64."""
    fits = (a >= 0) & (b >= 0) & (a.cast(pl.Float64) * b.cast(pl.Float64) < 2.0**62)
    return pl.when(fits).then(a * b)


def params_exprs() -> list[pl.Expr]:
    """bytes/dtype/peer of rows with ``record_param_comms`` args (all vectorised).

    S = ``Out msg nelems`` for all-gather (the output), ``In msg nelems`` otherwise.
    """
    raw = pl.col("p_dtype").str.to_lowercase()
    size = raw.replace_strict(_DTYPE_SIZE, default=None, return_dtype=pl.Int64)
    op = pl.col("op")
    nelems = pl.when(op == "all_gather").then(pl.col("out_nelems")).otherwise(pl.col("in_nelems"))
    peer = (
        pl.when(op == "send").then(pl.col("dst_rank")).when(op == "recv").then(pl.col("src_rank"))
    )
    return [
        safe_product(nelems, size).alias("p_bytes"),
        raw.replace_strict(_DTYPE_NAME, default=pl.col("p_dtype"), return_dtype=pl.Utf8).alias(
            "p_dtype_c"
        ),
        peer.alias("p_peer"),
    ]


# --- per-call sizes from Input Dims ---------------------------------------------------------


def _decode(raw: msgspec.Raw) -> Any:
    if not raw:
        return None
    try:
        return msgspec.json.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def _numel(shape: Any) -> int | None:
    """Elements of one tensor shape ``[d0, d1, ...]`` ([] is a 0-dim tensor: 1 element)."""
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        return None
    return math.prod(shape)


def _tensor_bytes(shape: Any, type_name: Any) -> tuple[int | None, str | None]:
    """Bytes and canonical dtype of one tensor; an unknown dtype is kept as given, bytes None."""
    if not isinstance(type_name, str) or type_name in ("", "TensorList"):
        return None, None
    key = type_name.lower()
    numel = _numel(shape)
    if key not in DTYPES or numel is None:
        return None, _DTYPE_NAME.get(key, type_name)
    return numel * _DTYPE_SIZE[key], _DTYPE_NAME[key]


def call_bytes(
    raw_dims: msgspec.Raw, raw_types: msgspec.Raw, index: int
) -> tuple[int | None, str | None]:
    """Bytes and canonical dtype of argument ``index`` (-1: all tensor arguments summed).

    A ``TensorList`` argument (``c10d::allreduce_`` and friends) records its shapes but no
    dtype, so its bytes are unknown (None) although its element count is known.
    """
    dims, types = _decode(raw_dims), _decode(raw_types)
    if not isinstance(dims, list) or not isinstance(types, list) or len(dims) != len(types):
        return None, None
    if index >= 0:
        if index >= len(dims):
            return None, None
        return _tensor_bytes(dims[index], types[index])
    total, dtypes = 0, set()
    for shape, type_name in zip(dims, types):
        if type_name in ("", "Scalar", "ScalarList", "None"):
            continue
        nbytes, dtype = _tensor_bytes(shape, type_name)
        if nbytes is None:
            return None, dtype
        total += nbytes
        dtypes.add(dtype)
    if not dtypes:
        return None, None
    return total, (dtypes.pop() if len(dtypes) == 1 else "mixed")


def concrete_int(raw: msgspec.Raw, index: int) -> int | None:
    """``Concrete Inputs[index]`` as an int (the p2p peer is recorded as text, e.g. ``"1"``)."""
    values = _decode(raw)
    if not isinstance(values, list) or index >= len(values):
        return None
    value = values[index]
    if type(value) is int:
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None
