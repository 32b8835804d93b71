"""``python -m fusefs`` runs the seerfs CLI."""

import sys

from fusefs.cli.main import main

sys.exit(main())
