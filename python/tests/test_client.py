"""Gateway and Lease.

FakeServerTest runs against a small in-process HTTP server. GatewayE2ETest
runs against a real `rollgate serve` when ROLLGATE_TEST_GATEWAY is its URL
(cmd/rollgate/python_e2e_test.go starts one; ROLLGATE_TEST_TOKEN is its admin
token). ROLLGATE_TEST_REQUIRE=1 turns its skip into a failure.
"""
import json
import math
import os
import sys
import threading
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

# The package from the source tree, unless the installed one is under test
# (ROLLGATE_TEST_INSTALLED=1: scripts/test's fresh environment, test_package.py).
if os.environ.get("ROLLGATE_TEST_INSTALLED") != "1":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import rollgate  # noqa: E402
from rollgate import Gateway, GatewayError, Lease  # noqa: E402
from test_batch import grpo  # noqa: E402  (the reference estimator, docs/verl.md)

REQUIRE = os.environ.get("ROLLGATE_TEST_REQUIRE") == "1"


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def _send(self, status, obj=None):
        body = b"" if obj is None else json.dumps(obj).encode()
        self.send_response(status)
        if obj is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _route(self):
        srv = self.server
        n = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(n)) if n else None
        srv.seen.append((self.command, self.path, body, self.headers.get("Authorization")))
        if self.headers.get("Authorization") != "Bearer sekret":
            return self._send(401, {"error": {"message": "this /api/v1 route needs the admin token", "type": "authentication_error"}})
        if self.path == "/api/v1/tasks/dequeue":
            return self._send(204)
        if self.path == "/api/v1/tasks":
            return self._send(200, {"rollout_ids": ["ro-%d" % i for i in range(len(body))]})
        if self.path.startswith("/api/v1/rollouts?"):
            return self._send(200, {"rollouts": [{"rollout_id": "ro-0"}], "next_after": 7})
        if self.path == "/api/v1/rollouts/ro-0/heartbeat":
            return self._send(409, {"error": {"message": "lease lost: attempt superseded", "type": "invalid_request_error"}})
        if self.path == "/api/v1/bridge/lease":
            return self._send(200, {"lease_id": "lease-1", "expires_unix_nano": 5, "samples": srv.samples})
        if self.path == "/api/v1/bridge/ack":
            return self._send(200, {"acked": True})
        return self._send(404, {"error": {"message": "unknown route", "type": "not_found_error"}})

    do_GET = do_POST = _route


class FakeServerTest(unittest.TestCase):
    def setUp(self):
        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.srv.seen = []
        self.srv.samples = [
            {"uid": "u", "rollout_id": "a", "prompt_ids": [1, 2], "response_ids": [3], "response_mask": [1],
             "rollout_log_probs": [-0.5], "reward": 1, "advantage": 0.25},
            {"uid": "u", "rollout_id": "b", "prompt_ids": [4], "response_ids": [5, 6], "response_mask": [1, 1],
             "rollout_log_probs": [-1, -2], "reward": 0, "advantage": -0.25},
        ]
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        self.addCleanup(self.srv.server_close)
        self.addCleanup(self.srv.shutdown)
        self.url = "http://127.0.0.1:%d" % self.srv.server_address[1]

    def test_gateway(self):
        gw = Gateway(self.url, token="sekret")
        self.assertIsNone(gw.dequeue("w1"))
        self.assertEqual(gw.enqueue([{"task_id": "t"}, {"task_id": "t"}]), ["ro-0", "ro-1"])
        self.assertEqual(gw.enqueue_task("t", {"q": 1}, max_attempts=2), "ro-0")
        self.assertEqual(self.srv.seen[-1][2], [{"task_id": "t", "input": {"q": 1}, "max_attempts": 2}])
        page, nxt = gw.completed(after=3, limit=10, wait_s=1)
        self.assertEqual((page[0]["rollout_id"], nxt), ("ro-0", 7))
        self.assertIn("after=3", self.srv.seen[-1][1])
        self.assertIn("wait_s=1", self.srv.seen[-1][1])
        with self.assertRaises(GatewayError) as cm:
            gw.heartbeat("ro-0", "at-1")
        self.assertEqual(cm.exception.status, 409)
        self.assertEqual(cm.exception.message, "lease lost: attempt superseded")
        self.assertIn("lease lost", str(cm.exception))
        with self.assertRaises(GatewayError) as cm:
            Gateway(self.url).dequeue()
        self.assertEqual(cm.exception.status, 401)
        self.assertEqual(cm.exception.type, "authentication_error")

    def test_lease(self):
        lease = Lease(self.url, token="sekret", backend="numpy")
        t, nt, meta = lease.take(2)
        self.assertEqual(self.srv.seen[-1][2], {"n": 2})
        self.assertEqual(meta["lease_id"], "lease-1")
        self.assertEqual(t["prompts"].tolist(), [[1, 2], [0, 4]])
        self.assertEqual(t["responses"].tolist(), [[3, 0], [5, 6]])
        self.assertEqual(t["advantages"].tolist(), [[0.25, 0], [-0.25, -0.25]])
        self.assertEqual(nt["rollout_id"].tolist(), ["a", "b"])
        self.assertEqual(lease.ack(), {"acked": True})
        self.assertEqual(self.srv.seen[-1][2], {"lease_id": "lease-1"})
        with self.assertRaises(ValueError):
            lease.ack()



class GatewayE2ETest(unittest.TestCase):
    """The algorithm/runner loop against a real gateway, then the lease API."""

    def test_loop(self):
        url = os.environ.get("ROLLGATE_TEST_GATEWAY")
        if not url:
            if REQUIRE:
                self.fail("ROLLGATE_TEST_GATEWAY is not set (ROLLGATE_TEST_REQUIRE=1)")
            self.skipTest("ROLLGATE_TEST_GATEWAY not set")
        token = os.environ.get("ROLLGATE_TEST_TOKEN") or None
        gw = Gateway(url, token=token)
        if token:
            with self.assertRaises(GatewayError) as cm:
                Gateway(url).latest_resources()
            self.assertEqual(cm.exception.status, 401)
            self.assertIn("admin token", cm.exception.message)

        res = gw.put_resources({"sampling": {"temperature": 0.7}, "prompt": "Solve: {q}"})
        v = res["version"]
        self.assertGreaterEqual(v, 1)
        self.assertEqual(gw.latest_resources()["version"], v)
        self.assertEqual(gw.resources(v)["resources"]["sampling"], {"temperature": 0.7})
        with self.assertRaises(GatewayError) as cm:
            gw.resources(v + 1000)
        self.assertEqual(cm.exception.status, 404)
        self.assertTrue(cm.exception.message)

        run = os.urandom(4).hex()  # task ids unique to this run
        rewards = {"py-A-" + run: [1.0, 0.0, 0.5], "py-B-" + run: [0.7, 0.2]}
        tasks = [{"task_id": t, "input": {"q": "%s-%d" % (t, i)}, "max_attempts": 2, "lease_s": 60}
                 for t, rs in rewards.items() for i in range(len(rs))]
        ids = gw.enqueue(tasks)
        self.assertEqual(len(ids), 5)
        want_reward, want_ids = {}, {}
        left = {t: list(rs) for t, rs in rewards.items()}
        done = 0
        while True:
            lease = gw.dequeue("py-runner")
            if lease is None:
                break
            ro, at = lease["rollout_id"], lease["attempt_id"]
            self.assertIn(ro, ids)
            self.assertEqual(lease["resources_version"], v)
            self.assertTrue(lease["base_url"].endswith("/rollout/%s/attempt/%s/v1" % (ro, at)))
            hb = gw.heartbeat(ro, at, "py-runner")
            self.assertGreater(hb["lease_expires_unix_nano"], 0)
            k = ids.index(ro)
            prompt = [100 + k, 101, 102][: 1 + k % 3]
            response = [200 + k] * (1 + k)
            logprobs = [-0.1 * (j + 1) for j in range(len(response))]
            out = gw.report_calls(ro, [{"messages": [{"role": "user", "content": lease["input"]["q"]}], "response": "ok",
                                        "prompt_token_ids": prompt, "response_token_ids": response,
                                        "response_logprobs": logprobs, "token_source": "engine", "finish_reason": "stop"}],
                                  attempt_id=at)
            self.assertEqual(out["calls"][0]["sequence_id"], 1)
            value = left[lease["task_id"]].pop(0)
            gw.reward(ro, value, attempt_id=at)
            gw.status(ro, "succeeded", attempt_id=at, worker_id="py-runner")
            want_reward[ro], want_ids[ro] = value, (prompt, response, logprobs)
            done += 1
        self.assertEqual(done, 5)
        with self.assertRaises(GatewayError) as cm:  # a finished attempt's lease is gone
            gw.heartbeat(ids[0], "at-bogus")
        self.assertIn(cm.exception.status, (404, 409))
        self.assertTrue(cm.exception.message)

        page, nxt = gw.completed(after=0, limit=10000, wait_s=5)
        got = {r["rollout_id"]: r for r in page}
        for ro in ids:
            self.assertEqual(got[ro]["status"], "succeeded")
            self.assertEqual([w["value"] for w in got[ro]["rewards"]], [want_reward[ro]])
        self.assertGreater(nxt, 0)
        self.assertEqual(gw.completed(after=nxt, wait_s=0)[0], [])
        self.assertEqual(gw.rollout(ids[0])["status"], "succeeded")

        built = gw.build_batches(rollout_ids=ids, estimator="grpo", air=False)
        # The gateway's sample queue must hold only these (a fresh gateway).
        self.assertEqual(built["samples"], 5, built)
        self.assertEqual(built["queue"]["pending"], 5, built)
        lease = Lease(url, token=token, backend="numpy")
        t1, nt1, meta1 = lease.take(3)
        first = meta1["lease_id"]
        self.assertRegex(first, r"^lease-[0-9a-f]{32}$")  # 128 random bits, not lease-1
        self.assertEqual(t1["prompts"].shape[0], 3)
        self.assertEqual(lease.counts()["leased"], 3)
        t2, nt2, meta2 = lease.take(10)
        self.assertEqual(t2["prompts"].shape[0], 2)
        self.assertIsNone(lease.take(1))
        self.assertEqual(lease.ack(first), {"acked": True})
        self.assertEqual(lease.ack(meta2["lease_id"]), {"acked": True})
        self.assertEqual(lease.counts(), {"pending": 0, "leased": 0, "acked": 5})
        with self.assertRaises(GatewayError) as cm:
            lease.ack(first)
        self.assertEqual(cm.exception.status, 404)
        self.assertIn("unknown", cm.exception.message)

        for t, nt in ((t1, nt1), (t2, nt2)):
            b, p = t["prompts"].shape
            for i in range(b):
                ro = nt["rollout_id"][i]
                prompt, response, logprobs = want_ids[ro]
                self.assertEqual(t["prompts"][i, p - len(prompt):].tolist(), prompt)
                self.assertTrue(np.all(t["prompts"][i, : p - len(prompt)] == 0))
                self.assertEqual(t["responses"][i, : len(response)].tolist(), response)
                self.assertEqual(t["response_mask"][i].sum(), len(response))
                np.testing.assert_allclose(t["rollout_log_probs"][i, : len(response)], logprobs, rtol=1e-6)
                self.assertAlmostEqual(float(t["token_level_rewards"][i, len(response) - 1]), want_reward[ro], places=6)
        # GRPO over the five leased samples, by uid (task), from their scores.
        scores, uids, advs = [], [], []
        for t, nt in ((t1, nt1), (t2, nt2)):
            scores += t["token_level_scores"].sum(axis=1).astype(float).tolist()
            uids += nt["uid"].tolist()
            advs += [t["advantages"][i][t["response_mask"][i] == 1] for i in range(len(nt["uid"]))]
        self.assertEqual(len(set(uids)), 2)
        for a, w in zip(advs, grpo(scores, uids)):
            np.testing.assert_allclose(a, w, atol=1e-5)


if __name__ == "__main__":
    unittest.main()
