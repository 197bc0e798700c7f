"""python -m services.workers.hf --model-dir D --model-name N (a model dir with weights)"""

from services.workers.hf.main import main

main()
