"""`python -m scheduler ...` is the `gpupool` command (handy where the script is not on PATH)."""

import sys

from scheduler.cli_fast import main

sys.exit(main())
