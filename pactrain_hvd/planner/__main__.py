"""``python -m pactrain_hvd.planner``: see ``pactrain_hvd.planner.cli``."""

import sys

from pactrain_hvd.planner.cli import main

sys.exit(main())
