import sys

from semhealth.agent.dataplane.worker import main

sys.exit(main())
