"""Settings for the whole suite.

The suite runs as root in CI, where a scheduler's default is to run each
training job as the Unix account named like its owner. The tests' users
(alice, bob...) are token names, not accounts, so the suite runs jobs as the
service's own user; tests/service/test_job_accounts.py tests the per-owner
accounts with real Unix accounts, setting ``run_jobs_as`` itself.
"""

from __future__ import annotations

import os

os.environ.setdefault("GPUPOOL_RUN_JOBS_AS", "service")
