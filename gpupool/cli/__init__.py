"""The `gpupool` command: a client of the HTTP API (plus `serve` and `node-agent`, which start a service)."""
