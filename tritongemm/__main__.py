"""``python -m tritongemm tune|explain|cache``: see ``tritongemm.cli.main``."""

import sys

from .cli.main import main

if __name__ == "__main__":
    sys.exit(main())
