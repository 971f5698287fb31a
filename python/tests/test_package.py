"""The package as pip installs it (issue 30 item 5).

scripts/test makes a fresh virtual environment, installs the package the
README's way (pip install './python[parquet,test]', versions from
python/requirements/package-constraints.txt) and runs python/tests there with
ROLLGATE_TEST_INSTALLED=1: then rollgate must be the installed copy, not the
source tree, with the dependencies pyproject.toml declares, and pyarrow (the
parquet extra) must read a Parquet batch. Without ROLLGATE_TEST_INSTALLED these
tests skip (the source tree is under test).
"""
import importlib.metadata
import os
import sys
import tempfile
import unittest

import numpy as np

INSTALLED = os.environ.get("ROLLGATE_TEST_INSTALLED") == "1"
if not INSTALLED:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import rollgate  # noqa: E402

SOURCE = os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


@unittest.skipUnless(INSTALLED, "ROLLGATE_TEST_INSTALLED=1 not set: the source tree is under test")
class InstalledPackageTest(unittest.TestCase):
    def test_imported_from_site_packages(self):
        where = os.path.realpath(rollgate.__file__)
        self.assertFalse(where.startswith(SOURCE + os.sep), "rollgate imported from the source tree (%s), not the installed copy" % where)
        self.assertIn("site-packages", where)

    def test_declared_dependencies(self):
        self.assertEqual(importlib.metadata.version("rollgate"), "0.1.0")
        reqs = importlib.metadata.requires("rollgate") or []
        names = {r.split(";")[0].split(">")[0].split("=")[0].split("<")[0].strip(): r for r in reqs}
        self.assertIn("numpy", names, reqs)
        self.assertNotIn("extra", names["numpy"], "numpy must be a plain dependency: %s" % reqs)
        self.assertIn("pyarrow", names, reqs)
        self.assertIn('extra == "parquet"', names["pyarrow"], "pyarrow must be the parquet extra: %s" % reqs)
        meta = importlib.metadata.metadata("rollgate")
        self.assertEqual(meta["Requires-Python"], ">=3.10")

    def test_parquet_with_pyarrow(self):
        # The parquet extra is installed: a real pyarrow writes the bridge's
        # Parquet columns (trainer-bridge/parquet.go) and load_batch reads them.
        import pyarrow as pa
        import pyarrow.parquet as pq

        rows = [{"uid": "g", "rollout_id": "r1", "prompts": [1, 2], "responses": [3, 4], "response_mask": [1, 1],
                 "rollout_log_probs": [-0.5, -0.5], "token_level_scores": [0.0, 1.0], "advantages": [0.5, 0.5]},
                {"uid": "g", "rollout_id": "r2", "prompts": [5], "responses": [6], "response_mask": [1],
                 "rollout_log_probs": [-1.0], "token_level_scores": [0.0], "advantages": [-0.5]}]
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "batch.parquet")
            pq.write_table(pa.Table.from_pylist(rows), path)
            t, nt, meta = rollgate.load_batch(path, backend="numpy")
        self.assertEqual(t["input_ids"].tolist(), [[1, 2, 3, 4], [0, 5, 6, 0]])
        self.assertEqual(t["advantages"].tolist(), [[0.5, 0.5], [-0.5, 0]])
        self.assertEqual(t["rollout_log_probs"].dtype, np.float32)
        self.assertEqual(nt["rollout_id"].tolist(), ["r1", "r2"])


if __name__ == "__main__":
    unittest.main()
