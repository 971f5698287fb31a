"""LiteLLM proxy callback for bench/compare's litellm target: the capture.

LiteLLM's proxy keeps no record of the calls it serves unless a logging callback is
configured, and its built-in ones send to cloud services (Langfuse, Datadog, S3, ...) or
need a PostgreSQL database with Prisma (spend logs). This custom callback, LiteLLM's
documented hook for its own logging (``litellm_settings.callbacks`` in the proxy's
config), writes one JSON line per call -- the request's messages and parameters, the
answer (streams assembled by LiteLLM), timing and status -- to the file named by
LITELLM_CAPTURE_FILE, so that each served call can be counted afterwards.
"""

import json
import os

from litellm.integrations.custom_logger import CustomLogger


class JSONLCapture(CustomLogger):
    """Appends one JSON line per answered or failed call to LITELLM_CAPTURE_FILE."""

    def __init__(self) -> None:
        super().__init__()
        self._out = open(os.environ.get("LITELLM_CAPTURE_FILE", "litellm-capture.jsonl"), "a", encoding="utf-8")

    def _write(self, status, kwargs, response_obj, start_time, end_time):
        record = {
            "status": status,
            "call_id": kwargs.get("litellm_call_id"),
            "model": kwargs.get("model"),
            "messages": kwargs.get("messages"),
            "params": kwargs.get("optional_params"),
            "stream": bool(kwargs.get("stream")),
            "latency_s": (end_time - start_time).total_seconds(),
        }
        if status == "ok" and hasattr(response_obj, "model_dump"):
            record["response"] = response_obj.model_dump()
        elif status != "ok":
            record["error"] = str(kwargs.get("exception") or response_obj)
        self._out.write(json.dumps(record, default=str) + "\n")
        self._out.flush()

    async def async_log_success_event(self, kwargs, response_obj, start_time, end_time):
        self._write("ok", kwargs, response_obj, start_time, end_time)

    async def async_log_failure_event(self, kwargs, response_obj, start_time, end_time):
        self._write("error", kwargs, response_obj, start_time, end_time)


proxy_handler_instance = JSONLCapture()
