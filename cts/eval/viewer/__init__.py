"""`cts view` (above cts/eval/run/): the index and samples of run directories (view), the
HTTP API and its static page (app, static/), the socket and server loop (serve)."""
