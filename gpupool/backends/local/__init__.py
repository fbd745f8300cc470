"""The local backend: jobs as processes on this machine (one node, or a simulated pool of several), GPUs from the inventory."""
