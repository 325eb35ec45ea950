"""A stand-in for `vllm serve` on the GPU-shaped test cluster (no GPU, no vLLM there): it records
the arguments and environment the server was started with into $CTS_VLLM_RECORD_DIR (one JSON
file per server), then answers `GET /health` with 200 on its --host/--port until SIGTERM, so
that `cts serve` finds it ready and stops it as it would a real server. The roles' answers come
from scripted engines (tests/scripted_cts.py); only the serving path is real.

Installed as an executable named `vllm` on the job's PATH by
tests/slurm/test_slurm_gpu_cluster.py."""

from __future__ import annotations

import json
import os
import signal
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path


class Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def _value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def main(argv: list[str]) -> None:
    record = Path(os.environ["CTS_VLLM_RECORD_DIR"])
    record.mkdir(parents=True, exist_ok=True)
    name = _value(argv, "--served-model-name").replace("/", "_")
    task = os.environ.get("SLURM_ARRAY_TASK_ID", "-")
    document = {"argv": argv, "env": dict(os.environ), "pid": os.getpid()}
    (record / f"{name}.task-{task}.{os.getpid()}.json").write_text(json.dumps(document))
    server = HTTPServer((_value(argv, "--host"), int(_value(argv, "--port"))), Health)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
