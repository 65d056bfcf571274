import sys

from geotrain.cli import main

sys.exit(main())
