"""`python -m scheduler ...` is the `gpupool` command (handy where the script is not on PATH)."""

import sys

from scheduler.cli import main

sys.exit(main())
