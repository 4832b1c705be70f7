"""`python -m agent --root R SUBCOMMAND` (on a host it runs as the zipapp bin/gpu-train-agent)."""

import sys

from .cli import main

sys.exit(main(sys.argv[1:]))
