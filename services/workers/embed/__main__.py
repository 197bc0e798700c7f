"""python -m services.workers.embed --model-dir D [--model-name N] [--threads T] [--max-batch-size B]"""

from services.workers.embed.main import main

main()
