"""Starts Agent Lightning's API gateway for bench/compare's agl target.

The same application and uvicorn settings as ``agl-server`` (agentlightning/server/__main__.py:
``create_app(config)``, one worker, keep-alive 120 s), with the package's own
config/server.yaml overridden by ``key=value`` arguments as Hydra would take them, but with
logging at warning level: no uvicorn access line and no structlog debug line per call, as
rollgate runs at --log-level warn and nginx with access_log off in the same comparison.
The capture (a ``model_request`` event per call in the in-memory store) is unchanged.

Usage: python agl_serve.py host=127.0.0.1 port=8080 default_proxy.model_name=mock-model
"""

import logging
import os
import sys

import structlog
import uvicorn
from omegaconf import OmegaConf

import agentlightning
from agentlightning.server.app import create_app


def main() -> None:
    base = OmegaConf.load(os.path.join(os.path.dirname(agentlightning.__file__), "config", "server.yaml"))
    config = OmegaConf.merge(base, OmegaConf.from_dotlist(sys.argv[1:]))
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    app = create_app(config)
    uvicorn.run(
        app,
        host=str(config.host),
        port=int(config.port),
        workers=1,
        timeout_keep_alive=120,
        log_level="warning",
        access_log=False,
    )


if __name__ == "__main__":
    main()
