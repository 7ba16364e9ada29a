import sys

from fedpeer.app.cli import main

sys.exit(main())
