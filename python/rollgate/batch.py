"""Training batches as verl's DataProto.from_dict arguments.

The trainer bridge (trainer-bridge/tensors.go) writes safetensors with verl's
key names, left-padded prompts and right-padded responses; its per-row
non-tensor columns (uid, rollout_id, ...) are JSON arrays in the header's
__metadata__. Parquet, JSONL and leased samples are one row per sample and
are padded here exactly as the Go writer pads them.
"""
import json
import os
import struct

import numpy as np

__all__ = ["load_batch", "read_safetensors", "pad_rows", "to_backend"]

# safetensors dtype name -> numpy dtype (little-endian on disk). BF16 is
# handled apart: numpy has no bfloat16.
_DTYPES = {
    "BOOL": np.dtype("bool"),
    "U8": np.dtype("u1"),
    "I8": np.dtype("i1"),
    "I16": np.dtype("<i2"),
    "U16": np.dtype("<u2"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "I32": np.dtype("<i4"),
    "U32": np.dtype("<u4"),
    "F32": np.dtype("<f4"),
    "I64": np.dtype("<i8"),
    "U64": np.dtype("<u8"),
    "F64": np.dtype("<f8"),
}

_MAX_HEADER = 100 << 20


def read_safetensors(path):
    """Reads a safetensors file into ({name: numpy array}, {key: str}).

    Arrays are in data-offset order, in native byte order, and own their
    memory. BF16 tensors come back as float32 arrays (exact); load_batch
    turns them into torch.bfloat16 tensors.
    """
    arrays, metadata, _ = _read_safetensors(path)
    return arrays, metadata


def _read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError("%s: not a safetensors file (shorter than 8 bytes)" % path)
    (n,) = struct.unpack("<Q", data[:8])
    if n > _MAX_HEADER or n > len(data) - 8:
        raise ValueError("%s: safetensors header length %d out of range" % (path, n))
    try:
        header = json.loads(data[8 : 8 + n].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ValueError("%s: bad safetensors header: %s" % (path, e))
    if not isinstance(header, dict):
        raise ValueError("%s: safetensors header is not a JSON object" % path)
    metadata = header.pop("__metadata__", None) or {}
    base = 8 + n
    body = len(data) - base
    entries = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
    arrays, dtypes = {}, {}
    for name, info in entries:
        dtype_name = info.get("dtype")
        if dtype_name not in _DTYPES:
            raise ValueError("%s: tensor %s: unsupported dtype %r" % (path, name, dtype_name))
        dt = _DTYPES[dtype_name]
        shape = tuple(int(d) for d in info.get("shape", []))
        begin, end = (int(x) for x in info["data_offsets"])
        count = 1
        for d in shape:
            if d < 0:
                raise ValueError("%s: tensor %s: bad shape %r" % (path, name, shape))
            count *= d
        if not 0 <= begin <= end <= body or end - begin != count * dt.itemsize:
            raise ValueError("%s: tensor %s: offsets %r do not hold %d %s elements" % (path, name, [begin, end], count, dtype_name))
        a = np.frombuffer(data, dtype=dt, count=count, offset=base + begin).reshape(shape)
        if dtype_name == "BF16":
            a = (a.astype(np.uint32) << 16).view(np.float32)
        else:
            a = a.astype(dt.newbyteorder("="), copy=True)  # native order, aligned, writable
        arrays[name] = a
        dtypes[name] = dtype_name
    return arrays, {str(k): str(v) for k, v in metadata.items()}, dtypes


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def to_backend(arrays, backend=None, dtypes=None):
    """Converts {name: numpy array} to torch tensors (backend "torch", or None
    when torch is importable) or leaves them numpy ("numpy")."""
    if backend not in (None, "torch", "numpy"):
        raise ValueError('backend must be "torch", "numpy" or None, not %r' % (backend,))
    torch = None if backend == "numpy" else _torch()
    if torch is None:
        if backend == "torch":
            raise ImportError('backend="torch" but torch is not importable; install torch or use backend="numpy"')
        return arrays
    out = {}
    for k, a in arrays.items():
        if a.dtype in (np.uint16, np.uint32, np.uint64):
            a = a.astype(np.int64)  # torch has no unsigned types wider than 8 bits
        t = torch.from_numpy(np.ascontiguousarray(a))
        if dtypes and dtypes.get(k) == "BF16":
            t = t.to(torch.bfloat16)
        out[k] = t
    return out


def _object_array(values):
    a = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        a[i] = v
    return a


def _batch_size(arrays):
    for k in ("responses", "prompts", "input_ids"):
        if k in arrays and arrays[k].ndim >= 1:
            return arrays[k].shape[0]
    for a in arrays.values():
        if a.ndim >= 1:
            return a.shape[0]
    return None


def load_batch(path, backend=None, pad_id=0):
    """Loads a bridge batch as (tensors, non_tensors, meta_info), the
    arguments of verl's DataProto.from_dict.

    path: a .safetensors file (rollgate bridge --out x.safetensors), a
    .parquet file (needs pyarrow) or a .jsonl file (one sample per line).
    backend: None (torch tensors when torch is importable, else numpy),
    "torch" or "numpy". pad_id pads Parquet/JSONL rows (safetensors files are
    already padded).
    """
    ext = os.path.splitext(str(path))[1].lower()
    if ext == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as e:
            raise ImportError(
                "rollgate.load_batch: reading Parquet needs pyarrow, which is not importable; "
                "install pyarrow or write the batch as safetensors (rollgate bridge --out batch.safetensors)"
            ) from e
        rows = pq.read_table(str(path)).to_pylist()
        tensors, non_tensors, meta = pad_rows(rows, pad_id=pad_id)
        return to_backend(tensors, backend), non_tensors, meta
    if ext == ".jsonl":
        with open(path, "r", encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        tensors, non_tensors, meta = pad_rows(rows, pad_id=pad_id)
        return to_backend(tensors, backend), non_tensors, meta
    arrays, metadata, dtypes = _read_safetensors(path)
    b = _batch_size(arrays)
    parsed = {}
    for k, v in metadata.items():
        try:
            parsed[k] = json.loads(v)
        except ValueError:
            parsed[k] = v
    if b is None and isinstance(parsed.get("uid"), list):
        b = len(parsed["uid"])
    non_tensors, meta_info = {}, {}
    for k, v in parsed.items():
        if isinstance(v, list) and b is not None and len(v) == b:
            non_tensors[k] = _object_array(v)
        else:
            meta_info[k] = v
    return to_backend(arrays, backend, dtypes), non_tensors, meta_info


# Row columns that become tensors (both the bridge's row names and verl's).
_PROMPT_KEYS = ("prompt_ids", "prompts")
_RESPONSE_KEYS = ("response_ids", "responses")
_LOGPROB_KEYS = ("rollout_log_probs", "logprobs")
_TOKEN_FLOAT_KEYS = ("token_level_scores", "token_level_rewards", "advantages", "returns")
_CONSUMED = set(_PROMPT_KEYS + _RESPONSE_KEYS + _LOGPROB_KEYS + _TOKEN_FLOAT_KEYS + ("response_mask", "reward", "advantage"))


def _first(row, keys, default=None):
    for k in keys:
        if k in row and row[k] is not None:
            return row[k]
    return default


def pad_rows(rows, pad_id=0):
    """Pads one-sample-per-row dicts (the bridge's JSONL/Parquet rows or leased
    samples) into numpy tensors as trainer-bridge/tensors.go does:

      prompts [B,P] left-padded, responses [B,R] right-padded (pad_id),
      input_ids = prompts ++ responses, attention_mask 1 on real tokens,
      position_ids = cumsum(attention_mask) - 1 clipped at 0,
      response_mask 1 on generated tokens, rollout_log_probs on the mask
      (left out when any row lacks logprobs), token_level_scores and
      token_level_rewards: the row's scalar reward on its last response
      token, advantages: its advantage times response_mask, returns =
      advantages. Per-token list columns of those names are taken as given.

    Returns (tensors, non_tensors, meta_info) with numpy arrays; every other
    column becomes a numpy object array in non_tensors.
    """
    rows = list(rows)
    b = len(rows)
    prompts = [list(_first(r, _PROMPT_KEYS, [])) for r in rows]
    responses = [list(_first(r, _RESPONSE_KEYS, [])) for r in rows]
    p = max([len(x) for x in prompts] + [0])
    rl = max([len(x) for x in responses] + [0])
    L = p + rl
    t_prompts = np.full((b, p), pad_id, dtype=np.int64)
    t_responses = np.full((b, rl), pad_id, dtype=np.int64)
    attn = np.zeros((b, L), dtype=np.int64)
    mask = np.zeros((b, rl), dtype=np.int64)
    logprobs = np.zeros((b, rl), dtype=np.float32)
    floats = {k: np.zeros((b, rl), dtype=np.float32) for k in _TOKEN_FLOAT_KEYS}
    have_logprobs = b > 0
    for i, r in enumerate(rows):
        pr, rs = prompts[i], responses[i]
        n = len(rs)
        if pr:
            t_prompts[i, p - len(pr) :] = pr
            attn[i, p - len(pr) : p] = 1
        if n:
            t_responses[i, :n] = rs
            attn[i, p : p + n] = 1
        m = r.get("response_mask")
        m = [1] * n if m is None else list(m)
        if len(m) != n:
            raise ValueError("row %d (%s): %d response ids, %d mask" % (i, r.get("rollout_id", "?"), n, len(m)))
        mask[i, :n] = np.asarray(m, dtype=np.int64) == 1
        lp = _first(r, _LOGPROB_KEYS)
        if r.get("has_logprobs") is False or lp is None or len(lp) != n:
            have_logprobs = False
        elif n:
            logprobs[i, :n] = np.asarray(lp, dtype=np.float32) * mask[i, :n]
        for k in _TOKEN_FLOAT_KEYS:
            v = r.get(k)
            if isinstance(v, (list, tuple, np.ndarray)):
                if len(v) != n:
                    raise ValueError("row %d: %s has %d entries for %d response tokens" % (i, k, len(v), n))
                floats[k][i, :n] = np.asarray(v, dtype=np.float32)
        if not isinstance(r.get("token_level_scores"), (list, tuple, np.ndarray)) and n:
            floats["token_level_scores"][i, n - 1] = float(r.get("reward") or 0.0)
        if not isinstance(r.get("token_level_rewards"), (list, tuple, np.ndarray)):
            floats["token_level_rewards"][i] = floats["token_level_scores"][i]
        if isinstance(r.get("advantages"), (list, tuple, np.ndarray)):
            floats["advantages"][i] *= mask[i]
        else:
            floats["advantages"][i] = np.float32(float(r.get("advantage") or 0.0)) * mask[i]
        if not isinstance(r.get("returns"), (list, tuple, np.ndarray)):
            floats["returns"][i] = floats["advantages"][i]
    input_ids = np.concatenate([t_prompts, t_responses], axis=1)
    pos = np.clip(np.cumsum(attn, axis=1) - 1, 0, None).astype(np.int64)
    tensors = {
        "prompts": t_prompts,
        "responses": t_responses,
        "input_ids": input_ids,
        "attention_mask": attn,
        "position_ids": pos,
        "response_mask": mask,
    }
    if have_logprobs:
        tensors["rollout_log_probs"] = logprobs
    tensors.update(floats)
    keys = []
    for r in rows:
        for k in r:
            if k not in _CONSUMED and k not in keys:
                keys.append(k)
    non_tensors = {k: _object_array([r.get(k) for r in rows]) for k in keys}
    return tensors, non_tensors, {}
