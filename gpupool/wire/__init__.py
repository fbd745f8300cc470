"""The wire: what crosses the HTTP API (limits, errors, the text rules); imports nothing else of gpupool."""
