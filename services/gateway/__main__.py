"""python -m services.gateway: serve GatewayService (behind Envoy)."""

from services.gateway.main import main

main()
