"""`python -m gpupool ...` is the `gpupool` command (handy where the script is not on PATH)."""

import sys

from gpupool.cli.main import main

sys.exit(main())
