"""python -m services.workers.attach --engine-grpc HOST:PORT [--engine-dns NAME:PORT] ..."""

import sys

from services.workers.attach.main import main

sys.exit(main())
