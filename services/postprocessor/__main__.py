"""python -m services.postprocessor: serve PostprocessorService."""

from services.postprocessor.main import main

main()
