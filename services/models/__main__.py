import sys

from services.models.cli import main

sys.exit(main())
