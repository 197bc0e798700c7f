"""python -m services.workers.diffusers --model-dir D [--task auto] [--device auto] [--dtype auto] ..."""

from services.workers.diffusers.main import main

main()
