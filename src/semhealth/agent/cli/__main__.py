"""``python -m semhealth.agent.cli``: the ``semhealth`` command."""

import sys

from semhealth.agent.cli import main

sys.exit(main())
