import sys

from tpuserve.cli import main

sys.exit(main())
