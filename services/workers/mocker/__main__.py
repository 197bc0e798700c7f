"""python -m services.workers.mocker --model-dir D --model-name N [--speedup-ratio R] [--script F]"""

from services.workers.mocker.main import main

main()
