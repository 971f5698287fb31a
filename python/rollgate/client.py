"""HTTP clients for the gateway (urllib only).

Gateway: the /api/v1 routes algorithm and runner scripts use (task queue,
heartbeats, rewards, statuses, resources, the completed-rollouts cursor).
Lease: the trainer's pull API (/api/v1/bridge/lease, /ack, /counts; or the
root of `rollgate bridge --serve` with prefix="").
"""
import json
import urllib.error
import urllib.parse
import urllib.request

from .batch import pad_rows, to_backend

__all__ = ["Gateway", "GatewayError", "Lease"]


class GatewayError(Exception):
    """A non-2xx answer. message is the gateway's error.message (or the body)."""

    def __init__(self, status, message, type=None, body=None, method=None, url=None):
        self.status, self.message, self.type, self.body = status, message, type, body
        self.method, self.url = method, url
        super().__init__("%s %s: HTTP %s: %s" % (method, url, status, message))


class _HTTP:
    def __init__(self, url, token=None, timeout=60.0):
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout

    def request(self, method, path, body=None, query=None, timeout=None):
        """Returns the decoded JSON body, or None on 204."""
        url = self.url + path
        if query:
            q = {k: v for k, v in query.items() if v is not None}
            if q:
                url += "?" + urllib.parse.urlencode(q)
        data = None
        headers = {"Accept": "application/json"}
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = "Bearer " + self.token
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout if timeout is None else timeout) as resp:
                raw = resp.read()
                if resp.status == 204 or not raw.strip():
                    return None
                return json.loads(raw.decode("utf-8"))
        except urllib.error.HTTPError as e:
            raw = e.read() or b""
            text = raw.decode("utf-8", "replace")
            message, typ = text.strip() or e.reason, None
            try:
                err = json.loads(text).get("error")
                if isinstance(err, dict):
                    message, typ = err.get("message", message), err.get("type")
                elif isinstance(err, str):
                    message = err
            except (ValueError, AttributeError):
                pass
            raise GatewayError(e.code, message, typ, text, method, url) from None


class Gateway:
    """The gateway's /api/v1 API.

    url: the gateway's address (http://host:port); token: the admin token
    (--admin-token / ROLLGATE_ADMIN_TOKEN), sent as Authorization: Bearer.
    Errors raise GatewayError carrying the gateway's error.message.
    """

    def __init__(self, url, token=None, timeout=60.0):
        self._http = _HTTP(url, token, timeout)
        self.url = self._http.url

    def _api(self, method, path, body=None, query=None, timeout=None):
        return self._http.request(method, "/api/v1" + path, body, query, timeout)

    @staticmethod
    def _id(rollout_id):
        return urllib.parse.quote(rollout_id, safe="")

    # Task queue ---------------------------------------------------------

    def enqueue(self, tasks):
        """Enqueues one task (a dict) or a list of them: {"task_id", "input",
        "mode", "max_attempts", "timeout_s", "lease_s", "metadata",
        "rollout_id"}. Returns the rollout ids, in order."""
        body = tasks if isinstance(tasks, (list, tuple)) else [tasks]
        return self._api("POST", "/tasks", list(body))["rollout_ids"]

    def enqueue_task(self, task_id, input=None, **fields):
        """Enqueues one task; returns its rollout id."""
        t = {"task_id": task_id, "input": input}
        t.update(fields)
        return self.enqueue(t)[0]

    def delete_task(self, rollout_id):
        """Removes a task still waiting in the queue (DELETE /api/v1/tasks/{id});
        GatewayError 404 when unknown, 409 once an attempt of it started."""
        return self._api("DELETE", "/tasks/%s" % self._id(rollout_id))

    def dequeue(self, worker_id=None):
        """Leases the next task to a runner: the lease (rollout_id, attempt_id,
        attempt_no, task_id, input, base_url, resources_version, ...) or None
        when the queue is empty."""
        return self._api("POST", "/tasks/dequeue", {"worker_id": worker_id} if worker_id else {})

    def heartbeat(self, rollout_id, attempt_id, worker_id=None):
        """Extends an attempt's lease; worker_id is the one given to dequeue.
        GatewayError 409 when the lease is lost, 403 when it is another worker's."""
        body = {"attempt_id": attempt_id}
        if worker_id:
            body["worker_id"] = worker_id
        return self._api("POST", "/rollouts/%s/heartbeat" % self._id(rollout_id), body)

    # Rollouts -----------------------------------------------------------

    def register(self, task_id="", rollout_id=None, attempt_id=None, metadata=None):
        """Registers a rollout (POST /api/v1/rollouts); the answer has base_url."""
        body = {"task_id": task_id}
        for k, v in (("rollout_id", rollout_id), ("attempt_id", attempt_id), ("metadata", metadata)):
            if v is not None:
                body[k] = v
        return self._api("POST", "/rollouts", body)

    def reward(self, rollout_id, value, name=None, attempt_id=None, sequence_id=None):
        """Posts a reward (name defaults to "primary"; sequence_id for a per-call one)."""
        body = {"value": value}
        for k, v in (("name", name), ("attempt_id", attempt_id), ("sequence_id", sequence_id)):
            if v is not None:
                body[k] = v
        return self._api("POST", "/rollouts/%s/rewards" % self._id(rollout_id), body)

    def status(self, rollout_id, status, attempt_id=None, reason=None, worker_id=None):
        """Reports an attempt's end: succeeded, failed (retried), cancelled, running.
        An attempt leased by dequeue needs its attempt_id and the worker_id
        it was leased to (GatewayError 400, 403 or 409 otherwise)."""
        body = {"status": status}
        if attempt_id is not None:
            body["attempt_id"] = attempt_id
        if worker_id:
            body["worker_id"] = worker_id
        if reason is not None:
            body["reason"] = reason
        return self._api("POST", "/rollouts/%s/status" % self._id(rollout_id), body)

    def report_calls(self, rollout_id, calls, attempt_id=None):
        """Self-reports calls ({"messages"|"prompt"|"request", "response",
        "prompt_token_ids", "response_token_ids", "response_logprobs",
        "token_source", "reward", ...}) for an agent that is not proxied."""
        body = {"calls": list(calls)}
        if attempt_id is not None:
            body["attempt_id"] = attempt_id
        return self._api("POST", "/rollouts/%s/calls" % self._id(rollout_id), body)

    def rollout(self, rollout_id):
        """A rollout's attempts, calls, rewards and queue state."""
        return self._api("GET", "/rollouts/%s" % self._id(rollout_id))

    def rollouts(self, after=None, limit=None, wait_s=None, status=None, ids=None, summary=None):
        """GET /api/v1/rollouts: {"rollouts": [...], "next_after": cursor}.
        With after, completed rollouts in completion order after the cursor;
        wait_s long-polls (at most 600) until one matches."""
        q = {"after": after, "limit": limit, "wait_s": wait_s, "status": status}
        if ids:
            q["ids"] = ",".join(ids)
        if summary is not None:
            q["summary"] = "1" if summary else "0"
        timeout = None
        if wait_s:
            timeout = max(self._http.timeout, float(wait_s) + 30)
        return self._api("GET", "/rollouts", query=q, timeout=timeout)

    def completed(self, after=0, limit=None, wait_s=None, summary=None):
        """One page of completed rollouts after a cursor: (rollouts, next_after)."""
        page = self.rollouts(after=after, limit=limit, wait_s=wait_s, summary=summary)
        return page.get("rollouts") or [], page.get("next_after", after)

    def follow(self, after=0, limit=100, wait_s=30):
        """Yields completed rollouts forever (long-polling), advancing the cursor."""
        while True:
            page, after = self.completed(after=after, limit=limit, wait_s=wait_s)
            for r in page:
                yield r

    # Resources ----------------------------------------------------------

    def put_resources(self, resources):
        """Publishes a new resources version ({name: JSON value}); returns
        {"version", "created_unix_nano", "resources"}."""
        return self._api("POST", "/resources", {"resources": resources})

    def resources(self, version="latest"):
        """A resources version (an int) or the latest ("latest")."""
        return self._api("GET", "/resources/%s" % version)

    def latest_resources(self):
        return self.resources("latest")

    # Bridge -------------------------------------------------------------

    def build_batches(self, **options):
        """POST /api/v1/bridge/batches: builds samples from the store into the
        gateway's lease queue (options as rollgate bridge's: tasks, after,
        estimator, mode, max_response, ...)."""
        return self._api("POST", "/bridge/batches", options, timeout=max(self._http.timeout, 1800))

    def lease(self, pad_id=0, backend=None):
        """A Lease on this gateway's sample queue."""
        return Lease(self.url, self._http.token, pad_id=pad_id, backend=backend, timeout=self._http.timeout)


class Lease:
    """The trainer's pull API: take(n) leases up to n samples and returns them
    padded as (tensors, non_tensors, meta_info) for DataProto.from_dict;
    ack() consumes them. A lease not acknowledged before it expires returns
    its samples to the queue.

    url: the gateway (routes under /api/v1/bridge); for `rollgate bridge
    --serve ADDR` pass prefix="". token: the admin token (ROLLGATE_ADMIN_TOKEN),
    sent as Authorization: Bearer; both the gateway and `rollgate bridge
    --serve` require it when it is set.
    """

    def __init__(self, url, token=None, prefix="/api/v1/bridge", pad_id=0, backend=None, timeout=60.0):
        self._http = _HTTP(url, token, timeout)
        self.prefix = prefix.rstrip("/")
        self.pad_id, self.backend = pad_id, backend
        self.lease_id = None
        self.expires_unix_nano = None
        self.samples = None

    def take(self, n):
        """Leases up to n samples; None when the queue is empty."""
        out = self._http.request("POST", self.prefix + "/lease", {"n": int(n)})
        if out is None:
            self.lease_id, self.expires_unix_nano, self.samples = None, None, None
            return None
        self.lease_id = out["lease_id"]
        self.expires_unix_nano = out.get("expires_unix_nano")
        self.samples = out.get("samples") or []
        tensors, non_tensors, meta = pad_rows(self.samples, pad_id=self.pad_id)
        meta = dict(meta, lease_id=self.lease_id, expires_unix_nano=self.expires_unix_nano)
        return to_backend(tensors, self.backend), non_tensors, meta

    def ack(self, lease_id=None):
        """Acknowledges a lease (the last one taken by default); GatewayError
        404 when it is unknown, already acknowledged or expired."""
        lid = lease_id or self.lease_id
        if not lid:
            raise ValueError("no lease to acknowledge")
        out = self._http.request("POST", self.prefix + "/ack", {"lease_id": lid})
        if lid == self.lease_id:
            self.lease_id = None
        return out

    def counts(self):
        """{"pending", "leased", "acked"}."""
        return self._http.request("GET", self.prefix + "/counts")
