import sys

from retool.sandbox.serve import main

sys.exit(main())
