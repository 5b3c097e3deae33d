import sys

from semhealth.agent.analysis.process import main

sys.exit(main())
