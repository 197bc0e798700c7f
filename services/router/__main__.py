"""python -m services.router: serve RouterService."""

from services.router.main import main

main()
