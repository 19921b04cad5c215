"""`python -m harness.cli`: what Ray Jobs run on a cluster."""

import sys

from harness.cli import main

sys.exit(main())
