import sys

from minigpt.zero.cli import main

sys.exit(main())
