"""``python -m minigpt.pages``: write every generated table, fragment and figure of the site."""

import sys

from minigpt.pages.site import main

sys.exit(main())
