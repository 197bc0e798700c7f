"""python -m services.preprocessor: serve PreprocessorService."""

from services.preprocessor.main import main

main()
