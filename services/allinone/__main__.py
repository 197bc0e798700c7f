"""python -m services.allinone: the gateway with every stage in-process (serves GatewayService behind Envoy)."""

from services.allinone.main import main

main()
