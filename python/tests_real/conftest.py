"""Fixtures for the tests that run the real parts: the rollgate binary, a real
vLLM (CPU) serving SmolLM2-135M-Instruct, verl's own code and HF transformers.

They run in the trainer environment (scripts/pyenv trainer) and are started by
scripts/test after the Go tests, with ROLLGATE_TEST_VLLM_URL and
ROLLGATE_TEST_VLLM_MODEL_DIR pointing at the vLLM that scripts/test started and
ROLLGATE_BIN at a built rollgate. Without them the tests fail with what is
missing; they never skip.
"""

import os
import re
import socket
import subprocess
import tempfile
import time
import urllib.request

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def rollgate_bin(tmp_path_factory):
    """The rollgate binary: ROLLGATE_BIN, else built from this checkout."""
    b = os.environ.get("ROLLGATE_BIN")
    if b:
        return b
    out = str(tmp_path_factory.mktemp("bin") / "rollgate")
    subprocess.run(["go", "build", "-o", out, "./cmd/rollgate"], cwd=REPO, check=True)
    return out


@pytest.fixture(scope="session")
def vllm():
    """(base URL, model folder, served model name) of the real vLLM."""
    url = os.environ.get("ROLLGATE_TEST_VLLM_URL", "")
    model_dir = os.environ.get("ROLLGATE_TEST_VLLM_MODEL_DIR", "")
    if not url or not model_dir:
        pytest.fail(
            "these tests need a real vLLM: set ROLLGATE_TEST_VLLM_URL and ROLLGATE_TEST_VLLM_MODEL_DIR "
            "(scripts/test does; by hand: go run ./testkit/testenv/vllmserver prints both)"
        )
    with urllib.request.urlopen(url + "/models", timeout=30) as r:
        assert r.status == 200, f"{url}/models answered {r.status}"
    return url, model_dir, "smollm2"


class Gateway:
    """A running `rollgate serve` in front of the real vLLM, or of its built-in
    mock engine when upstream is None. engine_url is the engine's /v1 base URL
    (the mock's as `serve` reports it), for direct calls that bypass rollgate."""

    def __init__(self, binary, upstream, db, log):
        self.binary = binary
        self.db = db
        self.addr = f"127.0.0.1:{_free_port()}"
        self.url = "http://" + self.addr
        self._log = open(log, "w")
        args = [binary, "serve", "--listen", self.addr, "--db", db]
        if upstream is not None:
            args += ["--upstream", upstream, "--upstream-kind", "vllm"]
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT)
        self.engine_url = upstream
        self.log_path = log
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"rollgate serve exited {self.proc.returncode}:\n{open(log).read()}")
            try:
                with urllib.request.urlopen(self.url + "/readyz", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"rollgate serve not ready after 60s:\n{open(log).read()}")
            time.sleep(0.05)  # polling /readyz: the process cannot tell us otherwise
        if upstream is None:
            m = re.search(r"started the built-in mock vLLM engine at (http://\S+/v1)", open(log).read())
            if not m:
                raise RuntimeError(f"rollgate serve did not report its built-in mock engine's address:\n{open(log).read()}")
            self.engine_url = m.group(1)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self._log.close()

    def bridge(self, *args):
        """Runs `rollgate bridge --db DB ARGS...`; returns its stderr summary."""
        p = subprocess.run([self.binary, "bridge", "--db", self.db, *args], capture_output=True, text=True)
        if p.returncode != 0:
            raise AssertionError(f"rollgate bridge {' '.join(args)} failed ({p.returncode}):\n{p.stderr}")
        return p.stderr


@pytest.fixture
def gateway(rollgate_bin, vllm, tmp_path):
    g = Gateway(rollgate_bin, vllm[0], str(tmp_path / "rollgate.db"), str(tmp_path / "serve.log"))
    yield g
    g.stop()


@pytest.fixture(scope="module")
def mock_gateway(rollgate_bin, tmp_path_factory):
    """rollgate serve with its built-in mock engine (no --upstream), one per test module."""
    d = tmp_path_factory.mktemp("mock")
    g = Gateway(rollgate_bin, None, str(d / "rollgate.db"), str(d / "serve.log"))
    yield g
    g.stop()
