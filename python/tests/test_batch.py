"""load_batch and pad_rows.

ROLLGATE_TEST_BATCH=path/to/batch.safetensors (written by the Go bridge;
cmd/rollgate/python_e2e_test.go sets it) adds checks on a real bridge file,
ROLLGATE_TEST_JSONL the same batch as JSONL (padded here, compared with the
Go writer's padding). ROLLGATE_TEST_REQUIRE=1 turns their skips into failures.
"""
import json
import math
import os
import struct
import sys
import tempfile
import unittest

import numpy as np

# The package from the source tree, unless the installed one is under test
# (ROLLGATE_TEST_INSTALLED=1: scripts/test's fresh environment, test_package.py).
if os.environ.get("ROLLGATE_TEST_INSTALLED") != "1":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import rollgate  # noqa: E402
from rollgate.batch import _torch  # noqa: E402

REQUIRE = os.environ.get("ROLLGATE_TEST_REQUIRE") == "1"


def need_env(name):
    v = os.environ.get(name)
    if not v:
        if REQUIRE:
            raise AssertionError("%s is not set (ROLLGATE_TEST_REQUIRE=1)" % name)
        raise unittest.SkipTest("%s not set" % name)
    return v


def write_safetensors(path, tensors, metadata=None):
    """A reference writer: tensors is [(name, dtype, shape, little-endian bytes)]."""
    header, off, blobs = {}, 0, []
    if metadata:
        header["__metadata__"] = metadata
    for name, dt, shape, blob in tensors:
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(blob)]}
        off += len(blob)
        blobs.append(blob)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


class SafetensorsTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        self.path = os.path.join(self.dir.name, "b.safetensors")
        bf = np.array([1.0, -2.5, 0.15625], dtype=np.float32)  # exact in bfloat16
        write_safetensors(
            self.path,
            [
                ("responses", "I64", (2, 3), np.array([[5, 6, 0], [7, 0, 0]], "<i8").tobytes()),
                ("advantages", "F32", (2, 3), np.array([[0.5, 0.5, 0], [-1, 0, 0]], "<f4").tobytes()),
                ("bf", "BF16", (3,), (bf.view(np.uint32) >> 16).astype("<u2").tobytes()),
                ("half", "F16", (2,), np.array([1.5, -0.25], "<f2").tobytes()),
                ("i32", "I32", (2,), np.array([-3, 4], "<i4").tobytes()),
                ("u8", "U8", (2,), bytes([0, 255])),
                ("flag", "BOOL", (2,), bytes([1, 0])),
                ("empty", "F32", (2, 0), b""),
            ],
            {
                "uid": json.dumps(["g1", "g1"]),
                "sequence_ids": json.dumps([[1, 2], [3]]),
                "has_logprobs": json.dumps([True, False]),
                "estimator": json.dumps("grpo"),
                "steps": json.dumps([1, 2, 3]),
                "note": "not json",
            },
        )

    def test_numpy(self):
        t, nt, meta = rollgate.load_batch(self.path, backend="numpy")
        self.assertEqual(t["responses"].dtype, np.int64)
        self.assertEqual(t["responses"].tolist(), [[5, 6, 0], [7, 0, 0]])
        self.assertEqual(t["advantages"].dtype, np.float32)
        self.assertEqual(t["bf"].tolist(), [1.0, -2.5, 0.15625])
        self.assertEqual(t["half"].dtype, np.float16)
        self.assertEqual(t["half"].tolist(), [1.5, -0.25])
        self.assertEqual(t["i32"].tolist(), [-3, 4])
        self.assertEqual(t["u8"].tolist(), [0, 255])
        self.assertEqual(t["flag"].tolist(), [True, False])
        self.assertEqual(t["empty"].shape, (2, 0))
        self.assertTrue(t["responses"].flags.writeable)
        self.assertEqual(sorted(nt), ["has_logprobs", "sequence_ids", "uid"])
        self.assertEqual(nt["uid"].dtype, object)
        self.assertEqual(nt["sequence_ids"].shape, (2,))
        self.assertEqual(nt["sequence_ids"][0], [1, 2])
        self.assertEqual(nt["has_logprobs"].tolist(), [True, False])
        self.assertEqual(meta, {"estimator": "grpo", "steps": [1, 2, 3], "note": "not json"})

    def test_torch(self):
        torch = _torch()
        if torch is None:
            self.skipTest("torch not importable")
        t, nt, _ = rollgate.load_batch(self.path)
        self.assertEqual(t["responses"].dtype, torch.int64)
        self.assertEqual(t["advantages"].dtype, torch.float32)
        self.assertEqual(t["bf"].dtype, torch.bfloat16)
        self.assertEqual(t["bf"].float().tolist(), [1.0, -2.5, 0.15625])
        self.assertEqual(t["half"].dtype, torch.float16)
        self.assertEqual(t["flag"].dtype, torch.bool)
        self.assertIsInstance(nt["uid"], np.ndarray)

    def test_without_torch(self):
        saved = sys.modules.get("torch")
        sys.modules["torch"] = None  # makes `import torch` raise ImportError
        try:
            t, _, _ = rollgate.load_batch(self.path)
            self.assertIsInstance(t["responses"], np.ndarray)
            with self.assertRaises(ImportError):
                rollgate.load_batch(self.path, backend="torch")
        finally:
            if saved is None:
                sys.modules.pop("torch", None)
            else:
                sys.modules["torch"] = saved

    def test_bad_files(self):
        p = os.path.join(self.dir.name, "short.safetensors")
        with open(p, "wb") as f:
            f.write(b"\x01")
        with self.assertRaises(ValueError):
            rollgate.load_batch(p)
        with open(p, "wb") as f:
            h = json.dumps({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
            f.write(struct.pack("<Q", len(h)) + h + b"\0" * 8)  # 8 bytes for 16
        with self.assertRaises(ValueError):
            rollgate.load_batch(p)

    def test_parquet_without_pyarrow(self):
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            with self.assertRaises(ImportError) as cm:
                rollgate.load_batch(os.path.join(self.dir.name, "x.parquet"))
            self.assertIn("safetensors", str(cm.exception))
        else:
            self.skipTest("pyarrow is importable")

    def test_parquet_rows_through_a_stub_pyarrow(self):
        # The Parquet path with a stand-in for pyarrow.parquet.read_table (the
        # rows as to_pylist gives them, columns named as trainer-bridge/parquet.go).
        import types
        rows = [{"uid": "g", "rollout_id": "r1", "prompt_ids": [1, 2], "response_ids": [3, 4], "response_mask": [1, 1],
                 "rollout_log_probs": [-0.5, -0.5], "reward": 1.0, "advantage": 0.5, "trimmed": False, "choice_index": 0},
                {"uid": "g", "rollout_id": "r2", "prompt_ids": [5], "response_ids": [6], "response_mask": [1],
                 "rollout_log_probs": [-1.0], "reward": 0.0, "advantage": -0.5, "trimmed": False, "choice_index": 0}]
        table = types.SimpleNamespace(to_pylist=lambda: rows)
        pq = types.ModuleType("pyarrow.parquet")
        pq.read_table = lambda path: table
        pa = types.ModuleType("pyarrow")
        pa.parquet = pq
        saved = {k: sys.modules.get(k) for k in ("pyarrow", "pyarrow.parquet")}
        sys.modules.update({"pyarrow": pa, "pyarrow.parquet": pq})
        try:
            t, nt, meta = rollgate.load_batch("x.parquet", backend="numpy")
        finally:
            for k, v in saved.items():
                if v is None:
                    sys.modules.pop(k, None)
                else:
                    sys.modules[k] = v
        self.assertEqual(t["input_ids"].tolist(), [[1, 2, 3, 4], [0, 5, 6, 0]])
        self.assertEqual(t["position_ids"].tolist(), [[0, 1, 2, 3], [0, 0, 1, 1]])
        self.assertEqual(t["token_level_scores"].tolist(), [[0, 1], [0, 0]])
        self.assertEqual(t["advantages"].tolist(), [[0.5, 0.5], [-0.5, 0]])
        self.assertEqual(nt["uid"].tolist(), ["g", "g"])
        self.assertEqual(nt["trimmed"].tolist(), [False, False])


class PadRowsTest(unittest.TestCase):
    def test_padding(self):
        rows = [
            {"uid": "g", "rollout_id": "r1", "prompt_ids": [1, 2, 3], "response_ids": [4, 5],
             "response_mask": [1, 1], "rollout_log_probs": [-0.5, -0.25], "reward": 1.0, "advantage": 0.5,
             "sequence_ids": [1]},
            {"uid": "g", "rollout_id": "r2", "prompt_ids": [7], "response_ids": [8, 9, 10],
             "response_mask": [1, 0, 1], "rollout_log_probs": [-1, -9, -2], "reward": 0.0, "advantage": -0.5,
             "sequence_ids": [1, 2]},
        ]
        t, nt, meta = rollgate.pad_rows(rows, pad_id=99)
        self.assertEqual(t["prompts"].tolist(), [[1, 2, 3], [99, 99, 7]])
        self.assertEqual(t["responses"].tolist(), [[4, 5, 99], [8, 9, 10]])
        self.assertEqual(t["input_ids"].tolist(), [[1, 2, 3, 4, 5, 99], [99, 99, 7, 8, 9, 10]])
        self.assertEqual(t["attention_mask"].tolist(), [[1, 1, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1]])
        self.assertEqual(t["position_ids"].tolist(), [[0, 1, 2, 3, 4, 4], [0, 0, 0, 1, 2, 3]])
        self.assertEqual(t["response_mask"].tolist(), [[1, 1, 0], [1, 0, 1]])
        self.assertEqual(t["rollout_log_probs"].tolist(), [[-0.5, -0.25, 0], [-1, 0, -2]])
        self.assertEqual(t["token_level_scores"].tolist(), [[0, 1, 0], [0, 0, 0]])
        self.assertEqual(t["token_level_rewards"].tolist(), t["token_level_scores"].tolist())
        self.assertEqual(t["advantages"].tolist(), [[0.5, 0.5, 0], [-0.5, 0, -0.5]])
        self.assertEqual(t["returns"].tolist(), t["advantages"].tolist())
        for k in ("prompts", "responses", "input_ids", "attention_mask", "position_ids", "response_mask"):
            self.assertEqual(t[k].dtype, np.int64, k)
        for k in ("rollout_log_probs", "token_level_scores", "token_level_rewards", "advantages", "returns"):
            self.assertEqual(t[k].dtype, np.float32, k)
        self.assertEqual(sorted(nt), ["rollout_id", "sequence_ids", "uid"])
        self.assertEqual(nt["sequence_ids"][1], [1, 2])
        self.assertEqual(meta, {})

    def test_missing_logprobs_leaves_them_out(self):
        rows = [{"prompt_ids": [1], "response_ids": [2], "rollout_log_probs": [-1.0], "has_logprobs": False},
                {"prompt_ids": [1], "response_ids": [2], "rollout_log_probs": [-1.0]}]
        t, nt, _ = rollgate.pad_rows(rows)
        self.assertNotIn("rollout_log_probs", t)
        self.assertEqual(nt["has_logprobs"].tolist(), [False, None])

    def test_token_lists(self):
        rows = [{"prompts": [1], "responses": [2, 3], "response_mask": [1, 1],
                 "token_level_scores": [0.25, 0.75], "advantages": [1.0, 2.0]}]
        t, _, _ = rollgate.pad_rows(rows)
        self.assertEqual(t["token_level_scores"].tolist(), [[0.25, 0.75]])
        self.assertEqual(t["token_level_rewards"].tolist(), [[0.25, 0.75]])
        self.assertEqual(t["advantages"].tolist(), [[1.0, 2.0]])
        self.assertEqual(t["returns"].tolist(), [[1.0, 2.0]])

    def test_empty(self):
        t, nt, _ = rollgate.pad_rows([])
        self.assertEqual(t["input_ids"].shape, (0, 0))
        self.assertEqual(nt, {})


def grpo(scores, uids):
    """GRPO as docs/verl.md states it: A = (s - mean_g) / (std_g + 1e-6), unbiased std; a group of one: mean 0, std 1."""
    groups = {}
    for s, u in zip(scores, uids):
        groups.setdefault(u, []).append(s)
    out = []
    for s, u in zip(scores, uids):
        g = groups[u]
        if len(g) == 1:
            mean, std = 0.0, 1.0
        else:
            mean = sum(g) / len(g)
            std = math.sqrt(sum((x - mean) ** 2 for x in g) / (len(g) - 1))
        out.append((s - mean) / (std + 1e-6))
    return out


class BridgeFileTest(unittest.TestCase):
    """A batch written by `rollgate bridge --out batch.safetensors --estimator grpo`."""

    def test_bridge_safetensors(self):
        path = need_env("ROLLGATE_TEST_BATCH")
        t, nt, meta = rollgate.load_batch(path, backend="numpy")
        b, p = t["prompts"].shape
        r = t["responses"].shape[1]
        self.assertGreater(b, 0)
        want = {"prompts": (b, p), "responses": (b, r), "input_ids": (b, p + r), "attention_mask": (b, p + r),
                "position_ids": (b, p + r), "response_mask": (b, r), "token_level_rewards": (b, r),
                "advantages": (b, r)}
        for k, shape in want.items():
            self.assertIn(k, t)
            self.assertEqual(t[k].shape, shape, k)
        for k in ("token_level_scores", "returns", "rollout_log_probs"):
            if k in t:
                self.assertEqual(t[k].shape, (b, r), k)
        for k, a in t.items():
            if k in ("prompts", "responses", "input_ids", "attention_mask", "position_ids", "response_mask"):
                self.assertEqual(a.dtype, np.int64, k)
            else:
                self.assertEqual(a.dtype, np.float32, k)
        self.assertEqual(t["input_ids"].tolist(), np.concatenate([t["prompts"], t["responses"]], 1).tolist())
        pos = np.clip(np.cumsum(t["attention_mask"], 1) - 1, 0, None)
        self.assertEqual(t["position_ids"].tolist(), pos.tolist())
        self.assertIn("uid", nt)
        self.assertEqual(nt["uid"].shape, (b,))
        self.assertEqual(nt["uid"].dtype, object)
        for k, v in nt.items():
            self.assertEqual(v.shape, (b,), k)

        mask = t["response_mask"].astype(bool)
        scores_t = t["token_level_scores"] if "token_level_scores" in t else t["token_level_rewards"]
        scores = scores_t.astype(np.float64).sum(axis=1).tolist()
        want_adv = grpo(scores, nt["uid"].tolist())
        for i in range(b):
            got = t["advantages"][i]
            self.assertTrue(np.all(got[~mask[i]] == 0), "row %d: advantage off the response mask" % i)
            np.testing.assert_allclose(got[mask[i]], want_adv[i], atol=1e-5, err_msg="row %d (uid %s)" % (i, nt["uid"][i]))
        if "returns" in t:
            np.testing.assert_array_equal(t["returns"], t["advantages"])

        expect = os.environ.get("ROLLGATE_TEST_BATCH_EXPECT")
        if expect:  # {"samples": B, "groups": G, "advantages": {rollout_id: A}}
            e = json.loads(expect)
            self.assertEqual(b, e["samples"])
            self.assertEqual(len(set(nt["uid"].tolist())), e["groups"])
            for i, ro in enumerate(nt["rollout_id"].tolist()):
                if ro in e.get("advantages", {}):
                    np.testing.assert_allclose(t["advantages"][i][mask[i]], e["advantages"][ro], atol=1e-5, err_msg=ro)

        torch = _torch()
        if torch is not None:
            tt, _, _ = rollgate.load_batch(path)
            self.assertEqual(tt["input_ids"].dtype, torch.int64)
            self.assertEqual(tt["advantages"].dtype, torch.float32)
            self.assertEqual(tuple(tt["input_ids"].shape), (b, p + r))

    def test_jsonl_pads_like_the_go_writer(self):
        path = need_env("ROLLGATE_TEST_BATCH")
        jsonl = need_env("ROLLGATE_TEST_JSONL")
        t, nt, _ = rollgate.load_batch(path, backend="numpy")
        j, jnt, _ = rollgate.load_batch(jsonl, backend="numpy")
        for k, a in t.items():
            self.assertIn(k, j)
            np.testing.assert_array_equal(j[k], a, err_msg=k)
        for k in ("uid", "rollout_id", "attempt_id", "task_id"):
            if k in nt:
                self.assertEqual(jnt[k].tolist(), nt[k].tolist(), k)


if __name__ == "__main__":
    unittest.main()
