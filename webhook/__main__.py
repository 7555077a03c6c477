"""`python -m webhook`: the gpu-webhook command line."""

import sys

from webhook.cli.main import main

sys.exit(main())
