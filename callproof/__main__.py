import sys

from callproof.cli import main

sys.exit(main())
