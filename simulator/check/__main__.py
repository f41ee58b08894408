"""`python -m simulator.check`: see `simulator.check.cli`."""

import sys

from simulator.check.cli import main

sys.exit(main())
